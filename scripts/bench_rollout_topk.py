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
"""What bypass mode's top-K costs the rollout: vLLM generation with ``logprobs=K`` against ``logprobs=0``.

One vLLM-CPU engine on the real model (SmolLM2-135M-Instruct, fp32, T=1, the learning runs' chat prompts and
response budget), asked exactly as verl's server asks in each mode: ``logprobs=0`` (verl's rollout log-probs, the
recompute path) or ``logprobs=K, flat_logprobs=True`` (TROLL's server in bypass mode,
:mod:`troll_verl.bypass.vllm_topk`).
The two are interleaved ABBA per repetition, so drift on this shared machine hits both alike. Reported per arm:

- generated tokens per second of ``LLM.generate`` (median over repetitions) and its ratio against ``logprobs=0``;
- the conversion TROLL adds in bypass mode (the server's arrays, then the mass rule and tail of
  :func:`troll_verl.bypass.rollout_topk.old_topk_from_rollout`), in microseconds per token;
- the bytes per response token the fields add: the server's ``(T, K)`` ids and log-probs in ``extra_fields``, and the
  stored old top-K (ids, log-probs, tail) the update reads, from the arrays themselves.

    .venv/bin/python scripts/bench_rollout_topk.py --prompts 32 --repeats 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _prompts(model_dir: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from troll_verl.assets.smollm2.task import ArithmeticTask, prompt_text

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train, _ = ArithmeticTask().split()
    chats = [[{"role": "user", "content": prompt_text(a, b)}] for a, b in (train * count)[:count]]
    # transformers 5 returns a BatchEncoding from tokenize=True; the text, then plain ids, is stable across versions
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def build_parser() -> argparse.ArgumentParser:
    """The command line (the docs' commands for this script are parsed with it: tests/docs/test_docs_on_cpu.py)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32, help="prompts per generate call")
    parser.add_argument("--max-tokens", type=int, default=16, help="response budget (the learning runs' 16)")
    parser.add_argument("--topk", type=int, default=64, help="TROLL's topk (K)")
    parser.add_argument("--repeats", type=int, default=4, help="ABBA repetitions (each runs both arms twice)")
    parser.add_argument("--cache-dir", default=None)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process: the timings are the engine's own
    import numpy as np
    import torch
    from vllm import LLM, SamplingParams

    from troll_verl.bypass.rollout_topk import old_topk_from_rollout, topk_arrays_from_logprobs
    from troll_verl.core.config import TrollConfig
    from troll_verl.tools.quickstart import MODELS

    assets = MODELS["smollm2"].build(args.cache_dir)
    prompts = _prompts(assets.model_dir, args.prompts)
    k, settings = args.topk, TrollConfig(topk=args.topk)
    llm = LLM(
        model=assets.model_dir,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        seed=0,
        distributed_executor_backend="uni",
        max_logprobs=k,
        logprobs_mode="processed_logprobs",
        kv_cache_memory_bytes=1 << 30,
    )
    inputs = [{"prompt_token_ids": p} for p in prompts]
    arms = {
        "logprobs=0 (recompute path)": {"logprobs": 0},
        f"logprobs={k}, flat (bypass mode)": {"logprobs": k, "flat_logprobs": True},
    }

    def generate(name: str, seed: int):
        params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=seed, detokenize=False, **arms[name])
        start = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        return time.perf_counter() - start, outs

    names = list(arms)
    for name in names:  # warm-up, one call each
        generate(name, 0)
    rates: dict[str, list[float]] = {name: [] for name in names}
    convert_us, fields_bytes, stored_bytes = [], [], []
    for rep in range(args.repeats):
        order = names if rep % 2 == 0 else names[::-1]
        for name in order + order[::-1]:
            seconds, outs = generate(name, 1000 + rep)
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            rates[name].append(tokens / seconds)
            if arms[name]["logprobs"]:
                start = time.perf_counter()
                arrays = [topk_arrays_from_logprobs(o.outputs[0].logprobs, k) for o in outs]
                ids = torch.from_numpy(np.concatenate([a for a, _ in arrays]))
                lps = torch.from_numpy(np.concatenate([b for _, b in arrays]))
                old = old_topk_from_rollout(
                    ids,
                    lps,
                    topk=k,
                    mass_delta=settings.mass_delta,
                    floor=settings.floor,
                    value_dtype=settings.value_dtype,
                )
                convert_us.append(1e6 * (time.perf_counter() - start) / tokens)
                fields_bytes.append(sum(a.nbytes + b.nbytes for a, b in arrays) / tokens)
                stored_bytes.append(sum(t.element_size() * t.numel() for t in old) / tokens)
        print(
            f"repetition {rep + 1}/{args.repeats}: "
            + ", ".join(f"{n}: {statistics.median(rates[n]):.0f} tok/s" for n in names),
            flush=True,
        )

    base = names[0]
    ratios = [t / b for t, b in zip(rates[names[1]], rates[base], strict=True)]
    print()
    print(
        f"SmolLM2-135M-Instruct, vLLM-CPU fp32, T=1, {args.prompts} prompts x up to {args.max_tokens} tokens per "
        f"call, {args.repeats} ABBA repetitions ({2 * args.repeats} calls per arm)"
    )
    print()
    print("| arm | generated tokens/s (median) | / logprobs=0, per call pair (median, range) |")
    print("|---|---|---|")
    print(f"| {base} | {statistics.median(rates[base]):.0f} | 1.00 |")
    print(
        f"| {names[1]} | {statistics.median(rates[names[1]]):.0f} | {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}-{max(ratios):.2f}) |"
    )
    print()
    print(f"bypass mode's conversion (arrays, mass rule, tail): {statistics.median(convert_us):.1f} us per token")
    print(
        f"bytes per response token: the server's fields {statistics.median(fields_bytes):.0f} "
        f"(ids int32 + log-probs fp32, K={k}); the stored old top-K {statistics.median(stored_bytes):.0f} "
        f"(ids int32, log-probs {settings.value_dtype}, tail fp32)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
