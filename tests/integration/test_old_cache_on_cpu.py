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
"""The actor worker's old top-K cache (troll_verl.integration.old_cache), without an engine."""

import torch

from troll_verl.core.layout import OLD_FIELDS
from troll_verl.integration.old_cache import OldTopKCache, row_keys
from troll_verl.testing.verl_engine import make_batch

K = 3


def _select(batch, index):
    picked = {key: [batch[key].unbind()[i] for i in index] for key in batch.keys()}
    return type(batch)(
        {k: torch.nested.as_nested_tensor(v, layout=torch.jagged) for k, v in picked.items()}, [len(index)]
    )


def _rows(batch, offset: float):
    """Response-aligned old fields and log-probs of ``batch``, values shifted by ``offset``."""
    n = int(batch["response_mask"].offsets()[-1])
    ids = torch.arange(n * K, dtype=torch.int32).view(n, K)
    fields = {OLD_FIELDS[0]: ids, OLD_FIELDS[1]: -ids.float() / 10 + offset, OLD_FIELDS[2]: -torch.ones(n) + offset}
    log_probs = torch.nested.nested_tensor_from_jagged(
        -torch.arange(n).float() / 7 + offset, batch["response_mask"].offsets()
    )
    return fields, log_probs


def _with_old_log_probs(batch, log_probs):
    data = batch.clone()
    data["old_log_probs"] = log_probs
    return data


def test_the_key_is_the_tokens_and_the_response_length():
    batch = make_batch(50, [2, 3, 2], [3, 2, 3], seed=0)
    keys = row_keys(batch)
    assert len(set(keys)) == 3
    same = _select(batch, [2, 0])
    assert row_keys(same) == [keys[2], keys[0]]  # order and batch do not matter


def test_an_update_takes_exactly_the_pass_its_old_log_probs_came_from():
    batch = make_batch(50, [2, 3], [3, 2], seed=1)
    cache = OldTopKCache()
    fields, log_probs = _rows(batch, 0.0)
    cache.put(batch, fields, log_probs)
    kept, hits = cache.take(_with_old_log_probs(batch, log_probs))
    assert hits == 2 and torch.equal(kept[OLD_FIELDS[1]].values(), fields[OLD_FIELDS[1]])
    # old_log_probs one ulp away on one sequence: another pass; refused, and the reason is counted
    other = log_probs.values().clone()
    other[0] = torch.nextafter(other[0], torch.tensor(1.0))
    kept, hits = cache.take(
        _with_old_log_probs(batch, torch.nested.nested_tensor_from_jagged(other, log_probs.offsets()))
    )
    assert kept is None and hits == 1 and cache.last_misses["other pass"] == 1
    cache.clear()
    kept, hits = cache.take(_with_old_log_probs(batch, log_probs))
    assert kept is None and hits == 0 and cache.last_misses["not kept"] == 2


def test_equal_sequences_in_two_micro_batches_each_find_their_own_copy():
    """GRPO's equal answers: the same tokens in two micro-batches, whose log-probs differ in the last bits."""
    batch = make_batch(50, [2], [3], seed=2)
    twice = _select(batch, [0, 0])
    cache = OldTopKCache()
    first_fields, first = _rows(batch, 0.0)
    second_fields, second = _rows(batch, 1e-7)
    cache.put(batch, first_fields, first)  # micro-batch 1
    cache.put(batch, second_fields, second)  # micro-batch 2: the same sequence, other rounding
    both = torch.nested.nested_tensor_from_jagged(
        torch.cat([first.values(), second.values()]), twice["response_mask"].offsets()
    )
    kept, hits = cache.take(_with_old_log_probs(twice, both))
    assert hits == 2
    tail = kept[OLD_FIELDS[2]].unbind()
    assert torch.equal(tail[0], first_fields[OLD_FIELDS[2]]) and torch.equal(tail[1], second_fields[OLD_FIELDS[2]])


def test_an_update_drops_what_it_used_and_what_no_update_took():
    a, b = make_batch(50, [2], [3], seed=3), make_batch(50, [3], [2], seed=4)
    cache = OldTopKCache()
    cache.put(a, *_rows(a, 0.0))
    cache.end_update(b)  # an update of other rows: a's entry was made since the previous update, it stays
    assert len(cache) == 1
    cache.end_update(b)  # one more update that did not take it: a stale entry, dropped
    assert len(cache) == 0
    cache.put(a, *_rows(a, 0.0))
    cache.end_update(a)  # used: dropped at once
    assert len(cache) == 0
