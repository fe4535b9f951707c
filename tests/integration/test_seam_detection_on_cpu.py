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
"""Seam detection (troll_verl.integration.seam) on fake verls: the seam is B's update hook with its trainer-written
switch and C's named old-pass output together; any part alone, or the first edition's shape, is no seam, and the plugin
registers loss ``troll`` on its own route there instead of building a spec verl cannot take."""

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import verl.workers.config as verl_config
from verl.trainer.ppo import core_algos

from troll_verl.core.layout import OLD_TOPK_KEYS
from troll_verl.integration import plugin, seam
from troll_verl.integration.seam import SEAM_SPEC_FIELDS, SEAM_SWITCH, seam_available


@dataclasses.dataclass(frozen=True)
class SpecB:
    """``PolicyLossSpec`` as upstream B adds it."""

    logits_fn: Callable | None = None
    logits_output_keys: tuple = ()
    provides_log_probs: bool = True


@dataclasses.dataclass(frozen=True)
class SpecFirstEdition(SpecB):
    """``PolicyLossSpec`` of the kit's first shape, with an old-pass hook named by the loss."""

    old_pass_fn: Callable | None = None
    old_pass_keys: tuple = ()


@dataclasses.dataclass
class ActorConfigC:
    """``ActorConfig`` with C's key."""

    calculate_old_topk: int = 0


@dataclasses.dataclass
class ActorConfigReleased:
    calculate_sum_pi_squared: bool = False


B = {"PolicyLossSpec": SpecB, "POLICY_LOSS_LOGITS": SEAM_SWITCH}
C = {"OLD_TOPK_KEYS": OLD_TOPK_KEYS}
VERLS = {  # name: (core_algos attributes, ActorConfig, seam)
    "released": ({}, ActorConfigReleased, False),
    "B alone": (B, ActorConfigReleased, False),
    "C alone": (C, ActorConfigC, False),
    "C without its config key": ({**B, **C}, ActorConfigReleased, False),
    "B without its switch": ({"PolicyLossSpec": SpecB, **C}, ActorConfigC, False),
    "C under other names": ({**B, "OLD_TOPK_KEYS": ("topk_ids", "topk_lp", "tail")}, ActorConfigC, False),
    "first edition": ({"PolicyLossSpec": SpecFirstEdition}, ActorConfigReleased, False),
    "B and C": ({**B, **C}, ActorConfigC, True),
}


def _fake_core_algos(spec):
    registered: dict[str, Any] = {}

    def register_policy_loss(name, spec=None):
        def decorator(fn):
            registered[name] = (fn, spec)
            return fn

        return decorator

    return SimpleNamespace(PolicyLossSpec=spec, register_policy_loss=register_policy_loss), registered


def test_the_plugins_spec_sets_exactly_the_seam_fields():
    assert set(plugin.troll_spec_fields()) == set(SEAM_SPEC_FIELDS)


@pytest.fixture
def fresh_route():
    """The route decided anew for this test's fake verl, and again after it for the installed one."""
    seam.route.cache_clear()
    yield
    seam.route.cache_clear()


def test_the_route_is_decided_once_per_process(monkeypatch, fresh_route):
    """route() asks seam_available() on its first call only: every later reader gets the same value."""
    asked = []
    monkeypatch.setattr(seam, "seam_available", lambda: asked.append(1) or True)
    assert seam.route() == seam.SEAM
    monkeypatch.setattr(seam, "seam_available", lambda: asked.append(1) or False)
    assert seam.route() == seam.SEAM and len(asked) == 1


@pytest.mark.parametrize("name", VERLS)
def test_a_partial_seam_is_no_seam_and_the_plugin_takes_its_own_route(monkeypatch, name, fresh_route):
    attributes, actor_config, seam = VERLS[name]
    for attribute in ("PolicyLossSpec", "POLICY_LOSS_LOGITS", "OLD_TOPK_KEYS"):
        if attribute in attributes:
            monkeypatch.setattr(core_algos, attribute, attributes[attribute], raising=False)
        else:
            monkeypatch.delattr(core_algos, attribute, raising=False)
    monkeypatch.setattr(verl_config, "ActorConfig", actor_config)
    assert seam_available() is seam
    fake, registered = _fake_core_algos(attributes.get("PolicyLossSpec"))
    monkeypatch.setattr(plugin, "registered_policy_loss", lambda name: None)
    plugin._register_policy_loss(fake)  # the first edition's C on a B-only verl raised TypeError here
    fn, registered_spec = registered[plugin.POLICY_LOSS_NAME]
    if seam:
        assert fn is plugin.troll_policy_loss_seam and isinstance(registered_spec, SpecB)
        assert registered_spec.logits_fn is plugin.troll_logits_hook
        assert registered_spec.logits_output_keys == plugin.troll_spec_fields()["logits_output_keys"]
        assert registered_spec.provides_log_probs is True
    else:
        assert fn is plugin.troll_policy_loss_stock and registered_spec is None
