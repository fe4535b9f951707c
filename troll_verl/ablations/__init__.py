# Copyright 2026 The troll-verl authors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The paper's ablations and this project's baselines, as variants of the core (:mod:`troll_verl.core.variants`).

The core implements the paper's choice of each switch; this package registers the others when it is imported
(troll-verl's settings import it, so every key below is accepted wherever troll-verl runs):

==================  ==========================  ==================================================================
``TrollConfig``     variant                     what it changes
==================  ==========================  ==================================================================
``solver``          ``bisection``               plain bisection in log η over [−8, log eta_max], the baseline the
                                                safeguarded Newton solver is measured against (:mod:`.solvers`)
``tail``            ``renormalize``             drop the tail bucket and renormalise on the union support: the
                                                paper's treatment (:mod:`.tails`)
``old_estimate``    ``upper``,                  old-side values of union tokens the old pass did not store,
                    ``proportional``            bounded by what it did store (:mod:`.old_estimates`)
``regression``      ``advantage``               the regression term only on tokens whose advantage is non-zero: a
                                                candidate remedy for the decay after mastery (:mod:`.regression`)
==================  ==========================  ==================================================================

None of them goes upstream: ``upstream/make_patches.py`` copies the core, which names only its own choices.
"""

from troll_verl.core.variants import register_variant

from .old_estimates import proportional_estimate, upper_estimate
from .regression import advantage_regression
from .solvers import solve_bisection
from .tails import renormalize_tail

__all__ = ["register"]


def register() -> None:
    """Register every variant of this package with the core; idempotent."""
    register_variant("solver", "bisection", solve_bisection)
    register_variant("tail", "renormalize", renormalize_tail)
    register_variant("old_estimate", "upper", upper_estimate)
    register_variant("old_estimate", "proportional", proportional_estimate)
    register_variant("regression", "advantage", advantage_regression)


register()
