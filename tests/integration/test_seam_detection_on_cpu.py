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
"""Seam detection (troll_verl.integration.seam) on fake verls: B alone (the update pass's hook without C's old-pass
hook) is no seam, and the plugin registers loss ``troll`` on its own route there instead of building a spec verl
cannot take; B and C together are the seam, and the plugin builds its spec."""

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from verl.trainer.ppo import core_algos

from troll_verl.core.losses import TROLL_SPEC_FIELDS
from troll_verl.integration import plugin
from troll_verl.integration.seam import SEAM_SPEC_FIELDS, seam_available


@dataclasses.dataclass(frozen=True)
class SpecB:
    """``PolicyLossSpec`` as upstream B alone adds it."""

    logits_fn: Callable | None = None
    logits_output_keys: tuple = ()
    provides_log_probs: bool = True


@dataclasses.dataclass(frozen=True)
class SpecBC(SpecB):
    """``PolicyLossSpec`` with C's old-pass hook too."""

    old_pass_fn: Callable | None = None
    old_pass_keys: tuple = ()


def _fake_core_algos(spec):
    registered: dict[str, Any] = {}

    def register_policy_loss(name, spec=None):
        def decorator(fn):
            registered[name] = (fn, spec)
            return fn

        return decorator

    return SimpleNamespace(PolicyLossSpec=spec, register_policy_loss=register_policy_loss), registered


def test_the_plugins_spec_sets_exactly_the_seam_fields():
    assert set(TROLL_SPEC_FIELDS) | {"logits_fn"} == set(SEAM_SPEC_FIELDS)


@pytest.mark.parametrize("spec, seam", [(None, False), (SpecB, False), (SpecBC, True)])
def test_a_partial_seam_is_no_seam_and_the_plugin_takes_its_own_route(monkeypatch, spec, seam):
    if spec is None:
        monkeypatch.delattr(core_algos, "PolicyLossSpec", raising=False)
    else:
        monkeypatch.setattr(core_algos, "PolicyLossSpec", spec, raising=False)
    assert seam_available() is seam
    fake, registered = _fake_core_algos(spec)
    monkeypatch.setattr(plugin, "registered_policy_loss", lambda name: None)
    plugin._register_policy_loss(fake)  # on B alone this built SpecB(old_pass_fn=...): TypeError
    fn, registered_spec = registered[plugin.POLICY_LOSS_NAME]
    if seam:
        assert fn is plugin.troll_policy_loss_seam and isinstance(registered_spec, SpecBC)
        assert registered_spec.old_pass_keys == TROLL_SPEC_FIELDS["old_pass_keys"]
    else:
        assert fn is plugin.troll_policy_loss_stock and registered_spec is None
