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
"""TROLL's policy-loss configuration for verl 0.9: a drop-in :class:`verl.workers.config.PolicyLossConfig` subclass.

Select it from the command line with ``actor_rollout_ref.actor.policy_loss._target_=troll_verl.config.
TrollPolicyLossConfig`` to set any of its keys; with only ``loss_mode=troll`` the paper's defaults are used
(see :func:`troll_settings`). The TROLL keys and their checks are :class:`troll_verl.core.config.TrollConfig`'s; here
they sit flat in ``policy_loss`` (``policy_loss.kl_bound``), and ``policy_loss.troll`` is the config itself, the
place TROLL's code reads them from (in verl with TROLL built in they are the nested ``policy_loss.troll``).
Whether a run may use them is :mod:`troll_verl.integration.checks`'s; the start-up checks are
:mod:`troll_verl.integration.startup`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from verl.workers.config import PolicyLossConfig

from troll_verl import ablations
from troll_verl.core.config import VALUE_DTYPES, TrollConfig
from troll_verl.kernels import KERNEL_CHOICES

__all__ = [
    "TrollPolicyLossConfig",
    "troll_settings",
    "use_troll_policy_loss_config",
    "VALUE_DTYPES",
    "POLICY_LOSS_CONFIG_TARGET",
]

# ``_target_`` of this module's settings class, and of verl's stock policy-loss config
POLICY_LOSS_CONFIG_TARGET = "troll_verl.config.TrollPolicyLossConfig"
_VERL_POLICY_LOSS_TARGET = "verl.workers.config.PolicyLossConfig"

# TROLL's switches accept the ablations' values too (solver bisection, tail renormalize, old_estimate upper and
# proportional) wherever troll-verl's settings are read
ablations.register()


@dataclass
class TrollPolicyLossConfig(PolicyLossConfig, TrollConfig):
    """verl's policy-loss settings plus TROLL's (:class:`~troll_verl.core.config.TrollConfig`), all flat under
    ``actor.policy_loss``; every TROLL value is validated on construction, errors name the key and the fix.

    Args:
        loss_mode (str): registered policy-loss name; ``"troll"``.
        kernels (str): the loss step's implementation: ``auto`` (Triton kernels for CUDA logits where triton
            imports, else torch), ``torch`` or ``triton`` (:mod:`troll_verl.kernels`); ``TROLL_KERNELS`` in a
            worker's environment overrides it. troll-verl's key, not TROLL's: verl's built-in TROLL has no kernels.
        diagnostics (bool): per optimizer step, the gradient norms of the policy-gradient part and of the regression
            part, the share of mini-batches whose advantages are all zero and their gradient norm, and the share of
            tokens projected only because of the floor (:mod:`troll_verl.integration.diagnostics`). Off by default:
            on, each optimizer step costs one extra forward and backward pass. troll-verl's key, not TROLL's.
        (the TROLL keys: see :class:`~troll_verl.core.config.TrollConfig`)
    """

    key_prefix: ClassVar[str] = "actor_rollout_ref.actor.policy_loss"

    loss_mode: str = "troll"
    kernels: str = "auto"
    diagnostics: bool = False

    def __post_init__(self):
        """Validate TROLL's keys (:class:`~troll_verl.core.config.TrollConfig`), ``kernels`` and ``diagnostics``."""
        super().__post_init__()
        self._choice("kernels", KERNEL_CHOICES)
        if not isinstance(self.diagnostics, bool):
            raise ValueError(f"{self.key_prefix}.diagnostics must be true or false, got {self.diagnostics!r}.")

    @property
    def troll(self) -> TrollConfig:
        """TROLL's settings: this config itself (verl with TROLL built in nests them as ``policy_loss.troll``)."""
        return self


def troll_settings(actor_config: Any) -> TrollPolicyLossConfig:
    """The TROLL settings of an actor config.

    Args:
        actor_config: a verl ``ActorConfig`` (or anything with a ``policy_loss`` attribute).

    Returns:
        ``actor_config.policy_loss`` if it already is a :class:`TrollPolicyLossConfig`; for a plain
        ``PolicyLossConfig`` (only ``loss_mode=troll`` was set) a :class:`TrollPolicyLossConfig` with the
        paper's defaults, carrying over the shared fields.
    """
    policy_loss = getattr(actor_config, "policy_loss", None)
    if isinstance(policy_loss, TrollPolicyLossConfig):
        return policy_loss
    if policy_loss is None:
        raise ValueError("The actor config has no policy_loss section; TROLL reads its settings from it.")
    shared = {f.name for f in fields(PolicyLossConfig)} - {"_target_"}
    return TrollPolicyLossConfig(**{name: policy_loss[name] for name in shared if name in policy_loss})


def use_troll_policy_loss_config(config) -> bool:
    """Select :class:`TrollPolicyLossConfig` where a full verl config still names verl's stock policy-loss config.

    verl's workers then build the actor config with TROLL's settings (the paper's defaults for keys not set), which
    is where TROLL's code reads them (``policy_loss.troll``). Returns True if ``_target_`` was changed.
    """
    from omegaconf import OmegaConf, open_dict

    node = OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss")
    if node is None or node.get("_target_", _VERL_POLICY_LOSS_TARGET) != _VERL_POLICY_LOSS_TARGET:
        return False
    with open_dict(node):
        node._target_ = POLICY_LOSS_CONFIG_TARGET
    return True
