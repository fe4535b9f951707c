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
"""Tests of troll_verl.core.megatron.losses' engine-facing functions: on megatron-core's parallel_state (megatron-core
installs with the CPU torch) and verl's own CP splitting, 2 ranks (gloo) of tensor or context parallelism equal the
FSDP backend on 1 rank. The vocab-parallel primitives: ``tests/core/test_megatron_losses_on_cpu.py``."""

import numpy as np
import pytest
import torch

from troll_verl.testing.dist import FileFunction, run_distributed

V, K, DELTA = 96, 6, 1e-3
PROMPTS, RESPONSES = [3, 5, 2, 4], [4, 2, 5, 3]


def _batch_and_logits():
    from verl.utils import tensordict_utils as tu

    from troll_verl.core.layout import response_rows
    from troll_verl.testing.verl_engine import make_batch

    batch = make_batch(V, PROMPTS, RESPONSES, seed=3)
    nnz = int(batch["input_ids"].offsets()[-1])
    g = torch.Generator().manual_seed(4)
    logits_old = torch.randn(nnz, V, generator=g, dtype=torch.float64) * 3
    logits = logits_old + torch.randn(nnz, V, generator=g, dtype=torch.float64)
    rows = response_rows(batch)
    labels = batch["input_ids"].values()[rows + 1]
    old_lp = torch.log_softmax(logits_old, -1)[rows, labels]
    batch["old_log_probs"] = torch.nested.nested_tensor_from_jagged(old_lp, batch["response_mask"].offsets())
    tu.assign_non_tensor(batch, troll_mode="update")
    return batch, logits_old, logits


def _settings():
    from troll_verl.integration.config import TrollPolicyLossConfig

    return TrollPolicyLossConfig(topk=K, mass_delta=DELTA, kl_bound=0.01)


def _fsdp_reference():
    from troll_verl.core.fsdp import losses as fsdp

    batch, logits_old, logits = _batch_and_logits()
    cfg = _settings()
    from troll_verl.core.layout import response_rows

    # per-row old top-K → response-aligned, as verl stores it
    old = {k: v[0][response_rows(batch)] for k, v in fsdp.compute_troll_old_topk(logits_old[None], batch, cfg).items()}
    offsets = batch["response_mask"].offsets()
    for key, value in old.items():
        batch[key] = torch.nested.nested_tensor_from_jagged(value, offsets)
    terms = fsdp.compute_troll_token_terms(logits[None], batch, cfg)
    # the solver's iteration count is per shard (each rank solves its own rows), not per row
    terms.pop("troll_solver_iters")
    return {k: v.detach() for k, v in old.items()}, {k: v.detach()[0] for k, v in terms.items()}, batch


def _megatron_rank(rank, world, tp, cp):
    from megatron.core import parallel_state as mpu

    from troll_verl.core.layout import response_rows
    from troll_verl.core.megatron import losses as mega

    mpu.initialize_model_parallel(tensor_model_parallel_size=tp, context_parallel_size=cp)
    old_ref, _, batch = _fsdp_reference()
    _, logits_old, logits = _batch_and_logits()
    cfg = _settings()
    vp = V // tp
    shard = slice(mpu.get_tensor_model_parallel_rank() * vp, (mpu.get_tensor_model_parallel_rank() + 1) * vp)
    offsets = batch["input_ids"].offsets()

    def local(x):  # the engine's CP split of per-row full-sequence logits, then this rank's vocabulary shard
        nested = torch.nested.nested_tensor_from_jagged(x[:, shard].contiguous(), offsets)
        return mega._cp_split(nested, "thd").reshape(1, -1, vp)

    old = mega.compute_troll_old_topk(local(logits_old), batch, cfg, "thd")
    terms = mega.compute_troll_token_terms(local(logits), batch, cfg, "thd")
    terms.pop("troll_solver_iters")
    # where each local row came from (global packed row, -1 for CP padding)
    rows_global = (
        mega._cp_split(
            torch.nested.nested_tensor_from_jagged(torch.arange(1, int(offsets[-1]) + 1), offsets), "thd"
        ).reshape(-1)[: terms["troll_proj_log_prob"].shape[1]]
        - 1
    )
    resp = response_rows(batch)
    return {
        "rows": rows_global.numpy().copy(),
        "resp_rows": resp.numpy().copy(),
        "old": {k: v[0].numpy().copy() for k, v in old.items()},
        "terms": {k: v.detach()[0].numpy().copy() for k, v in terms.items()},
    }


@pytest.mark.slow
@pytest.mark.parametrize("tp, cp", [(2, 1), (1, 2)])
def test_engine_functions_tp_cp_equal_single_rank(tp, cp):
    old_ref, terms_ref, _ = _fsdp_reference()
    results = run_distributed(FileFunction(__file__, "_megatron_rank"), tp * cp, tp, cp)
    covered = set()
    for res in results:
        rows = res["rows"]
        resp_pos = {int(r): i for i, r in enumerate(res["resp_rows"])}
        for j, g in enumerate(rows):
            if g < 0:
                continue
            for key, ref in terms_ref.items():
                np.testing.assert_allclose(res["terms"][key][j], ref[g].numpy(), atol=1e-10, rtol=1e-8, err_msg=key)
            if int(g) in resp_pos:
                i = resp_pos[int(g)]
                covered.add(i)
                for key, ref in old_ref.items():
                    np.testing.assert_allclose(res["old"][key][j], ref[i].numpy(), atol=1e-12, rtol=1e-10)
            else:
                assert (res["old"]["troll_old_ids"][j] == -1).all()
    assert covered == set(range(sum(RESPONSES)))
