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
"""Sparsity benchmark on the real model (SmolLM2-135M-Instruct): top-K coverage and the sparse KL's accuracy.

On the model's own sampled answers to its task (:mod:`troll_verl.assets.smollm2`), at each ``--temperatures``:

1. **Coverage**: tokens needed for 1 − δ of the mass at each response position (median, p90), and the share of
   positions where K falls short. Measured on the initial model and after the updates of step 2.
2. **Sparse KL against the full-vocabulary KL**, after ``--updates`` Adam steps (lr ``--lr``) of a REINFORCE
   objective with group-centred task rewards on the same answers (a stand-in for TROLL's real updates; the KL is
   per token between the policy before and after). For each old-side estimate (``floor``: the paper's 1e-12,
   ``upper``, ``proportional``; :func:`troll_verl.core.old_side.old_side_estimate`): the median ratio sparse / full,
   the share of tokens projected (sparse KL > ε), projected *only because of the estimate* (sparse > ε ≥ full)
   and missed (full > ε ≥ sparse).

Everything runs in this process with ``transformers`` (fp32, answers sampled with ``generate``, no top-k/top-p).

    .venv/bin/python scripts/bench_sparsity.py --temperatures 1.0 0.6 --updates 1 8
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from troll_verl import ablations
from troll_verl.assets.smollm2 import build_smollm2
from troll_verl.assets.smollm2.task import DATA_SOURCE, ArithmeticTask, compute_score, prompt_text
from troll_verl.core.projection import project
from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits
from troll_verl.core.variants import variant_names

ablations.register()  # the upper and proportional old-side estimates
OLD_ESTIMATES = variant_names("old_estimate")


def sample_answers(model, tokenizer, pairs, temperature: float, max_new_tokens: int, seed: int):
    """Left-padded batch of chat prompts → (input_ids, attention_mask, response positions mask, rewards)."""
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt_text(a, b)}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for a, b in pairs
    ]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
        )
    resp = out[:, width:]
    resp_mask = torch.ones_like(resp, dtype=torch.bool)
    for i in range(resp.shape[0]):  # up to and including the first EOS
        hits = (resp[i] == tokenizer.eos_token_id).nonzero()
        if len(hits):
            resp_mask[i, int(hits[0]) + 1 :] = False
    full_mask = torch.cat([mask.bool(), resp_mask], dim=1)
    rewards = torch.tensor(
        [
            compute_score(DATA_SOURCE, tokenizer.decode(resp[i][resp_mask[i]]), str(a + b))["score"]
            for i, (a, b) in enumerate(pairs)
        ]
    )
    return out, full_mask, width, resp_mask, rewards


def response_logits(model, seqs, full_mask, width, resp_mask, temperature):
    """``(R, V)`` temperature-scaled logits predicting each response token, and the ``(R,)`` tokens."""
    logits = model(input_ids=seqs, attention_mask=full_mask.long()).logits / temperature
    pred = logits[:, width - 1 : -1]  # row t predicts token t + 1
    tokens = seqs[:, width:]
    return pred[resp_mask], tokens[resp_mask]


def coverage(logits: torch.Tensor, delta: float, k: int) -> dict:
    p = torch.softmax(logits.double(), -1).sort(-1, descending=True).values
    needed = ((p.cumsum(-1) < 1 - delta).sum(-1) + 1).float()
    q = torch.quantile(needed, torch.tensor([0.5, 0.9], dtype=needed.dtype))
    return {"median": float(q[0]), "p90": float(q[1]), "share_over_k": float((needed > k).float().mean())}


def kl_accuracy(old_logits, new_logits, tokens, kl_bound, k, delta) -> dict:
    old_lp_full = torch.log_softmax(old_logits.double(), -1)
    new_lp_full = torch.log_softmax(new_logits.double(), -1)
    full = (new_lp_full.exp() * (new_lp_full - old_lp_full)).sum(-1).float()
    old = old_topk_from_logits(old_logits.float(), topk=k, mass_delta=delta)
    old_sampled = old_lp_full.gather(1, tokens[:, None]).squeeze(1).float()
    result = {"full_kl_median": float(full.median()), "full_over_bound": float((full > kl_bound).float().mean())}
    for estimate in OLD_ESTIMATES:
        sup = troll_sparse_from_logits(
            new_logits.float(), tokens, old, old_sampled, topk=k, mass_delta=delta, old_estimate=estimate
        )
        sparse = project(sup.new_logprobs, sup.old_logprobs, kl_bound, mask=sup.mask).kl_before
        moved = full > 1e-9
        ratio = (sparse[moved] / full[moved]).median() if bool(moved.any()) else torch.tensor(float("nan"))
        result[estimate] = {
            "ratio_median": float(ratio),
            "projected": float((sparse > kl_bound).float().mean()),
            "projected_by_estimate": float(((sparse > kl_bound) & (full <= kl_bound)).float().mean()),
            "missed": float(((full > kl_bound) & (sparse <= kl_bound)).float().mean()),
        }
    return result


def measure(model_dir, temperature, updates, lr, prompts, k, delta, kl_bound, seed, max_new_tokens) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    pairs = ArithmeticTask().split()[0][:prompts]
    seqs, full_mask, width, resp_mask, rewards = sample_answers(
        model, tokenizer, pairs, temperature, max_new_tokens, seed
    )
    with torch.no_grad():
        old_logits, tokens = response_logits(model, seqs, full_mask, width, resp_mask, temperature)
    out = {
        "temperature": temperature,
        "answers": len(pairs),
        "tokens": int(tokens.shape[0]),
        "reward": float(rewards.mean()),
        "coverage_before": coverage(old_logits, delta, k),
        "after": {},
    }
    advantages = rewards - rewards.mean()
    if bool((advantages == 0).all()):
        advantages = torch.ones_like(rewards)  # every answer scored the same: reinforce them all
    adv_tok = advantages[:, None].expand_as(resp_mask)[resp_mask]
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    done = 0
    for target in sorted(updates):
        while done < target:
            logits, _ = response_logits(model, seqs, full_mask, width, resp_mask, temperature)
            logp = torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1)
            loss = -(adv_tok * logp).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done += 1
        with torch.no_grad():
            new_logits, _ = response_logits(model, seqs, full_mask, width, resp_mask, temperature)
        entry = kl_accuracy(old_logits, new_logits, tokens, kl_bound, k, delta)
        entry["coverage"] = coverage(new_logits, delta, k)
        out["after"][str(target)] = entry
    return out


def report(results: list[dict], k: int, delta: float, kl_bound: float) -> str:
    lines = [
        f"K={k}, δ={delta}, ε={kl_bound}",
        "",
        "| T | answers (tokens), reward | tokens for 1 − δ: median / p90 (before → after last update) "
        "| positions needing > K (before → after) |",
        "|---|---|---|---|",
    ]
    for r in results:
        last = r["after"][max(r["after"], key=int)]["coverage"]
        cb = r["coverage_before"]
        lines.append(
            f"| {r['temperature']} | {r['answers']} ({r['tokens']}), {r['reward']:.3f} | "
            f"{cb['median']:.0f} / {cb['p90']:.0f} → {last['median']:.0f} / {last['p90']:.0f} | "
            f"{100 * cb['share_over_k']:.0f} % → {100 * last['share_over_k']:.0f} % |"
        )
    lines += [
        "",
        "| T | Adam steps | estimate | sparse KL / full KL (median) | projected | projected only by the "
        "estimate | full KL > ε but not projected |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for steps, entry in sorted(r["after"].items(), key=lambda kv: int(kv[0])):
            for estimate in OLD_ESTIMATES:
                e = entry[estimate]
                lines.append(
                    f"| {r['temperature']} | {steps} | {estimate} | {e['ratio_median']:.2f} | "
                    f"{100 * e['projected']:.1f} % | {100 * e['projected_by_estimate']:.1f} % | "
                    f"{100 * e['missed']:.1f} % |"
                )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line (the docs' commands for this script are parsed with it: tests/docs/test_docs_on_cpu.py)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.6])
    parser.add_argument("--updates", type=int, nargs="+", default=[1, 8], help="Adam steps after which to measure")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--topk", type=int, default=64)
    parser.add_argument("--mass-delta", type=float, default=1e-5)
    parser.add_argument("--kl-bound", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--json", default=None, help="also write the raw results here")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    assets = build_smollm2(args.cache_dir)
    results = []
    for temperature in args.temperatures:
        start = time.perf_counter()
        results.append(
            measure(
                assets.model_dir,
                temperature,
                args.updates,
                args.lr,
                args.prompts,
                args.topk,
                args.mass_delta,
                args.kl_bound,
                args.seed,
                args.max_new_tokens,
            )
        )
        print(f"[bench_sparsity] T={temperature}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    print(report(results, args.topk, args.mass_delta, args.kl_bound))
    return 0


if __name__ == "__main__":
    sys.exit(main())
