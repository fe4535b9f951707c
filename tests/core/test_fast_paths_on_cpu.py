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
"""The core's fast-path table (troll_verl.core.fast_paths): a registered function that serves replaces the torch path
with the call's arguments, one that declines (None) leaves the torch path's result, and a vocabulary the caller
shards (its own statistics) never reaches it."""

import pytest
import torch

from troll_verl.core import fast_paths
from troll_verl.core.config import TrollConfig
from troll_verl.core.sparse import ChunkStatistics, old_topk_from_logits, troll_sparse_from_logits
from troll_verl.core.terms import troll_token_terms


@pytest.fixture
def table():
    """The table emptied for the test (the suite's plugin registers the kernels) and restored after it."""
    saved = {name: fast_paths.fast_path(name) for name in fast_paths.FAST_PATHS}
    for name in fast_paths.FAST_PATHS:
        fast_paths.register_fast_path(name, None)
    yield fast_paths
    for name, fn in saved.items():
        fast_paths.register_fast_path(name, fn)


def _inputs():
    gen = torch.Generator().manual_seed(5)
    z_old, z = torch.randn(2, 4, 50, generator=gen, dtype=torch.float64).unbind(0)
    sampled = torch.tensor([3, 7, 49, 0])
    old_lp = torch.log_softmax(z_old, -1).gather(1, sampled[:, None]).squeeze(1)
    return z_old, z, sampled, old_lp


def _step():
    z_old, z, sampled, old_lp = _inputs()
    old = old_topk_from_logits(z_old, topk=8, mass_delta=1e-4)
    support = troll_sparse_from_logits(z, sampled, old, old_lp, topk=8, mass_delta=1e-4)
    terms, _ = troll_token_terms(support, TrollConfig(topk=8, mass_delta=1e-4))
    return old, support, terms


def test_unknown_names_are_refused_naming_the_entries(table):
    with pytest.raises(ValueError, match="old_topk"):
        table.register_fast_path("sparse", lambda *a, **k: None)


def test_a_fast_path_that_serves_replaces_the_torch_path_with_the_call_arguments(table):
    calls = []

    def serve(name, result):
        def fn(*args, **kwargs):
            calls.append((name, args, kwargs))
            return result

        return fn

    sentinels = {name: object() for name in table.FAST_PATHS}
    for name in table.FAST_PATHS:
        table.register_fast_path(name, serve(name, sentinels[name]))
    z_old, z, sampled, old_lp = _inputs()
    assert old_topk_from_logits(z_old, topk=8, mass_delta=1e-4) is sentinels["old_topk"]
    assert calls[-1] == ("old_topk", (z_old, 8, 1e-4, 1e-12, torch.float32, None, None), {})
    old = old_topk_from_logits(z_old, topk=8, mass_delta=1e-4, statistics=ChunkStatistics())  # a caller's own layout
    assert len(calls) == 1 and old.ids.shape == (4, 8)  # the torch path: the table was not asked
    got = troll_sparse_from_logits(z, sampled, old, old_lp, topk=8, mass_delta=1e-4)
    assert got is sentinels["sparse_support"]
    name, args, kwargs = calls[-1]
    assert name == "sparse_support" and args[0] is z and args[2] is old
    assert kwargs == dict(topk=8, mass_delta=1e-4, floor=1e-12, chunk_size=None, rows=None, old_estimate="floor")
    support = troll_sparse_from_logits(z, sampled, old, old_lp, topk=8, mass_delta=1e-4, statistics=ChunkStatistics())
    cfg = TrollConfig(topk=8, mass_delta=1e-4)
    assert troll_token_terms(support, cfg) is sentinels["token_terms"]
    assert calls[-1] == ("token_terms", (support, cfg, None), {})


def test_a_fast_path_that_declines_leaves_the_torch_result(table):
    reference = _step()
    asked = []
    for name in table.FAST_PATHS:
        table.register_fast_path(name, lambda *a, _name=name, **k: asked.append(_name))  # returns None: declines
    declined = _step()
    assert asked == list(table.FAST_PATHS)
    for want, got in zip(reference, declined, strict=True):
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
