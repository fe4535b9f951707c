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
"""How hard is the real model's addition task before training? The untrained model on operands in ``[0, hi)``.

For each ``--hi``, on the held-out problems of that task (:meth:`troll_verl.assets.smollm2.SmolSpec.addition`: at
least 80), SmolLM2-135M-Instruct (the asset's fp32 model, in this process with ``transformers``) answers each prompt
in the chat format the trainer uses:

- greedily once (what the runs' validation measures), and
- ``--samples`` times at T = 1 with no top-k / top-p (what the rollout samples at step 1),

each answer at most ``--max-new-tokens`` tokens (the runs' response length), scored by the task's reward
(:func:`troll_verl.assets.smollm2.task.compute_score`). It then applies the powered study's pre-stated rule
(docs/benchmarks.md, "Powered study", committed before this ran): the largest ``hi`` with T = 1 accuracy
>= ``--min-sampled`` and greedy accuracy <= ``--max-greedy``.

    .venv/bin/python scripts/bench_task.py --hi 15 20 30 --samples 4 --out benchmarks/results/powered_study/task.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from troll_verl.assets.smollm2 import SmolSpec, build_smollm2
from troll_verl.assets.smollm2.task import DATA_SOURCE, ArithmeticTask, compute_score, prompt_text


def answer(model, tokenizer, pairs, *, samples: int, greedy: bool, max_new_tokens: int, seed: int, batch: int):
    """Decoded answers, ``samples`` per pair (1 when greedy), in the trainer's chat format; left-padded batches."""
    out = []
    for start in range(0, len(pairs), batch):
        chunk = pairs[start : start + batch]
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt_text(a, b)}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            for a, b in chunk
        ]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        torch.manual_seed(seed + start)
        sampling = (
            {"do_sample": False}
            if greedy
            else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "num_return_sequences": samples}
        )
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                **sampling,
            )
        out += tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
    return out


def accuracy(pairs, answers: list[str], per_pair: int) -> float:
    """Mean task reward of ``answers`` (``per_pair`` consecutive answers per pair, as ``generate`` returns them)."""
    truths = [str(a + b) for a, b in pairs for _ in range(per_pair)]
    if len(truths) != len(answers):
        raise ValueError(f"{len(answers)} answers for {len(pairs)} problems x {per_pair}")
    scores = [compute_score(DATA_SOURCE, text, truth)["score"] for text, truth in zip(answers, truths, strict=True)]
    return sum(scores) / len(scores)


def choose(results: list[dict], min_sampled: float, max_greedy: float) -> int | None:
    """The pre-stated rule: the largest hi with sampled accuracy >= min_sampled and greedy accuracy <= max_greedy."""
    ok = [r["hi"] for r in results if r["sampled_acc"] >= min_sampled and r["greedy_acc"] <= max_greedy]
    return max(ok) if ok else None


def build_parser() -> argparse.ArgumentParser:
    """The command line (the docs' commands for this script are parsed with it: tests/docs/test_docs_on_cpu.py)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hi", type=int, nargs="+", default=[15, 20, 30])
    parser.add_argument("--samples", type=int, default=4, help="T = 1 answers per held-out problem")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--min-sampled", type=float, default=0.05)
    parser.add_argument("--max-greedy", type=float, default=0.5)
    parser.add_argument("--limit", type=int, default=None, help="only the first LIMIT held-out problems (smoke test)")
    parser.add_argument("--batch", type=int, default=40, help="prompts per generate call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", default=None, help="write the results here (JSON)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assets = build_smollm2(args.cache_dir)  # the weights are the same for every task; only the split differs
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32).eval()
    results = []
    for hi in args.hi:
        spec = SmolSpec.addition(hi)
        _, held_out = ArithmeticTask(spec.lo, spec.hi, spec.val_fraction, spec.split_seed).split()
        held_out = held_out[: args.limit] if args.limit else held_out
        start = time.perf_counter()
        common = {"max_new_tokens": args.max_new_tokens, "seed": args.seed, "batch": args.batch}
        greedy = answer(model, tokenizer, held_out, samples=1, greedy=True, **common)
        sampled = answer(model, tokenizer, held_out, samples=args.samples, greedy=False, **common)
        results.append(
            {
                "hi": hi,
                "held_out": len(held_out),
                "samples": args.samples,
                "greedy_acc": accuracy(held_out, greedy, 1),
                "sampled_acc": accuracy(held_out, sampled, args.samples),
                "seconds": round(time.perf_counter() - start, 1),
                "examples": {"greedy": greedy[:3], "sampled": sampled[:3]},
            }
        )
        r = results[-1]
        print(
            f"hi={hi}: {r['held_out']} held out; greedy accuracy {r['greedy_acc']:.3f}, T=1 accuracy "
            f"{r['sampled_acc']:.3f} ({args.samples} samples each); {r['seconds']:.0f} s",
            flush=True,
        )
    chosen = choose(results, args.min_sampled, args.max_greedy)
    rule = f"largest hi with T=1 accuracy >= {args.min_sampled} and greedy accuracy <= {args.max_greedy}"
    print(f"\n| hi | held out | greedy accuracy | T = 1 accuracy ({args.samples} samples each) |\n|---|---|---|---|")
    for r in results:
        print(f"| {r['hi']} | {r['held_out']} | {r['greedy_acc']:.3f} | {r['sampled_acc']:.3f} |")
    print(f"\nrule: {rule} -> {'hi = ' + str(chosen) if chosen is not None else 'no hi qualifies'}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(
                {
                    "rule": rule,
                    "chosen": chosen,
                    "results": results,
                    "max_new_tokens": args.max_new_tokens,
                    "seed": args.seed,
                    "model": assets.info.get("model"),
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
