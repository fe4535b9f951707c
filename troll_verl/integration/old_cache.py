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
"""The old policy's top-K kept on the actor worker that computed it, from verl's old-log-prob pass to the update.

verl's old-log-prob pass runs on the same actor worker, on the same rows, as the update that follows it; TROLL's
logits hook computes the old top-K (:data:`~troll_verl.core.layout.OLD_FIELDS`, 516 bytes a token at the defaults)
in that pass, and :class:`OldTopKCache` keeps it there instead of returning it into verl's data plane.

A row is identified by its tokens (the packed ``input_ids`` of the sequence and its response length): the old
distribution is a function of the tokens and the weights, so the key does not depend on how a trainer orders,
shards or labels its rows (TransferQueue keys, a ``DataProto``'s uids). An entry also keeps the sampled tokens'
log-probs of the pass that made it; the update takes an entry only where they equal the ``old_log_probs`` it
received, so the ratio and the projection always use the same old policy. Any other row is a miss, and the worker
recomputes (:class:`troll_verl.integration.workers.TrollActorTrainingWorker`).

NOTE: equal sequences are common in GRPO groups (short answers), and two copies in different micro-batches can
differ in the last bits (a packed micro-batch's kernels round by its length); a key keeps every distinct copy, and
the update takes the one whose log-probs are exactly its row's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from troll_verl.core.layout import OLD_FIELDS, response_lengths, response_values

__all__ = ["OldTopKCache", "row_keys"]


def row_keys(data: TensorDict) -> list[bytes]:
    """One key per sequence of ``data``: a 128-bit digest of its tokens and its response length.

    Args:
        data: a batch or micro-batch with nested ``input_ids`` ``(bsz, prompt+response)`` and ``response_mask``.
    """
    lengths = response_lengths(data).tolist()
    keys = []
    for ids, n in zip(data["input_ids"].unbind(), lengths, strict=True):
        digest = hashlib.blake2b(ids.detach().to("cpu", torch.int64).numpy().tobytes(), digest_size=16)
        digest.update(int(n).to_bytes(8, "little"))
        keys.append(digest.digest())
    return keys


@dataclass
class _Entry:
    fields: tuple[torch.Tensor, ...]  # OLD_FIELDS of one sequence, (j, K), (j, K), (j,)
    log_probs: torch.Tensor  # (j,) fp32: the sampled tokens' log-probs of the same pass
    generation: int  # how many updates had ended when the old pass made it


class OldTopKCache:
    """Old top-K rows by sequence, filled by the old-log-prob pass and taken by the next update.

    Entries live in host memory (the old pass's device memory is freed for the rollout and the update); an update
    drops what it used and what is older than itself.
    """

    def __init__(self):
        self._entries: dict[bytes, list[_Entry]] = {}
        self._generation = 0
        # why the last take missed: sequences not kept, kept from another pass (and their largest log-prob gap)
        self.last_misses: dict[str, float] = {}

    def __len__(self) -> int:
        """How many distinct sequences are kept."""
        return len(self._entries)

    def put(self, data: TensorDict, full: dict[str, torch.Tensor], log_probs: torch.Tensor) -> None:
        """Keep one micro-batch's old top-K (every Ulysses rank holds the whole micro-batch's rows here).

        Args:
            data: the micro-batch (nested ``input_ids``, ``response_mask``).
            full: :data:`~troll_verl.core.layout.OLD_FIELDS` response-aligned, ``(R, K)``, ``(R, K)``, ``(R,)``, R the
                micro-batch's response tokens in verl's order (sequence by sequence).
            log_probs: the sampled tokens' log-probs of this pass, padded ``(bsz, T)`` or nested.
        """
        lengths = response_lengths(data)
        sizes = lengths.tolist()
        per_field = [torch.split(full[key].detach().to("cpu"), sizes) for key in OLD_FIELDS]
        sampled = torch.split(response_values(log_probs, lengths).detach().to("cpu", torch.float32), sizes)
        for i, key in enumerate(row_keys(data)):
            entry = _Entry(tuple(f[i] for f in per_field), sampled[i], self._generation)
            copies = [e for e in self._entries.get(key, []) if not torch.equal(e.log_probs, entry.log_probs)]
            self._entries[key] = [*copies, entry]

    def take(self, data: TensorDict, check_log_probs: bool = True) -> tuple[dict[str, torch.Tensor] | None, int]:
        """The old top-K of every sequence of ``data`` as nested ``(bsz, j, ...)`` tensors, if all are kept.

        Args:
            data: the update's shard (nested ``input_ids``, ``response_mask``; ``old_log_probs`` nested or padded).
            check_log_probs: take an entry only where its log-probs equal ``data``'s ``old_log_probs``.

        Returns:
            ``(fields, hits)``: the fields (None unless every sequence hit) and how many sequences hit.
        """
        lengths = response_lengths(data)
        expected = None
        if check_log_probs:
            old = response_values(data["old_log_probs"], lengths).detach().to("cpu", torch.float32)
            expected = torch.split(old, lengths.tolist())
        found = []
        self.last_misses = {"not kept": 0, "other pass": 0, "max_abs_diff": 0.0}
        for i, key in enumerate(row_keys(data)):
            copies = self._entries.get(key, [])
            entry = copies[-1] if copies else None
            if entry is None:
                self.last_misses["not kept"] += 1
            elif expected is not None:
                same = [
                    e
                    for e in copies
                    if e.log_probs.shape == expected[i].shape and torch.equal(e.log_probs, expected[i])
                ]
                if not same:
                    self.last_misses["other pass"] += 1
                    for e in copies:
                        if e.log_probs.shape == expected[i].shape:
                            diff = float((e.log_probs - expected[i]).abs().max())
                            self.last_misses["max_abs_diff"] = max(self.last_misses["max_abs_diff"], diff)
                entry = same[0] if same else None
            found.append(entry)
        hits = sum(entry is not None for entry in found)
        if hits < len(found):
            return None, hits
        device = data["input_ids"].device
        fields = {
            key: torch.nested.as_nested_tensor([e.fields[j] for e in found], layout=torch.jagged).to(device)
            for j, key in enumerate(OLD_FIELDS)
        }
        return fields, hits

    def log_probs(self, data: TensorDict) -> list[torch.Tensor]:
        """The latest kept sampled-token log-probs ``(j,)`` of every sequence of ``data`` (all must be kept), the
        ones :meth:`take` without the check returns the fields of."""
        return [self._entries[key][-1].log_probs for key in row_keys(data)]

    def end_update(self, data: TensorDict) -> None:
        """After an update: drop the entries it used, and those made before the previous update that no update took
        (an old pass whose update never came); entries made since for a later update stay."""
        for key in row_keys(data):
            self._entries.pop(key, None)
        self._entries = {
            k: kept for k, c in self._entries.items() if (kept := [e for e in c if e.generation >= self._generation])
        }
        self._generation += 1

    def clear(self) -> None:
        """Drop every entry (a test's forced miss; a checkpoint load)."""
        self._entries.clear()
