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
"""Learning benchmark: TROLL vs clip (GRPO, GSPO), several seeds, verl's real trainer and vLLM rollout on CPU.

``--model tiny`` (default) is the built-in task; ``--model smollm2`` the real pretrained LLM (SmolLM2-135M-Instruct,
:mod:`troll_verl.assets.smollm2`). For every (variant, loss, seed) it runs the quickstart's configuration for that model
(:func:`troll_verl.tools.quickstart.cpu_run_overrides`) and reports, per variant, TROLL against its clip baseline
measured
in the same invocation:

- steps to target: the first step whose trailing 5-step mean train reward reaches ``--target`` (a run that never
  gets there counts as ``steps + 1`` and is marked ``>``);
- final reward: mean train reward over the last min(10, steps // 3) steps (at least 1: 3 of 10, 10 of 40); gain:
  that minus the mean of the first min(5, steps // 4) steps (at least 1: 2 of 10, 5 of 40); the step-1 reward
  (sampled from the same initial model by both losses: the paired sampling noise); final greedy validation accuracy;
- entropy over the same last steps; the share of tokens projected (TROLL) or clipped (clip), mean over steps;
- per phase (generation, old-log-prob pass, update) and per step the median seconds, and the trainer worker's peak
  resident memory, as TROLL / clip ratios per seed.

Variants: ``grpo`` (token ratio; clip = verl's ``vanilla`` with clip 0.2 and dual-clip 3; 2 optimizer steps per
batch, the quickstart's), ``grpo8`` (the same with 8 optimizer steps per batch, the paper's schedule), ``async1`` and
``async2`` (``grpo`` on verl's ``colocate_async`` trainer with 1 or 2 warm-up batches: stale data, reported with
its staleness and verl's KL(rollout ‖ old) estimate) and ``gspo``
(sequence ratio, ``seq-mean-token-mean``; clip = verl's ``gspo`` with clip 0.2 both ways; TROLL with
``ratio_level=sequence``).
Runs are interleaved seed by seed so machine noise spreads over all configurations. Each finished run's per-step
metrics (filtered) and its record are written to ``--results-dir`` at once; finished runs are reused, so an
interrupted benchmark loses nothing that finished and continues where it stopped, and ``--report-only`` regenerates
every table and plot from those files without running anything.

The stress map (``--stress``; docs/benchmarks.md, "Stress map", states its criteria): ``lr3e-5`` ... ``lr1e-4``
(``grpo`` at a larger learning rate), ``gspo8`` (GSPO with verl's own GSPO clip range 3e-4 / 4e-4 and 8 optimizer
steps per batch, against TROLL's sequence-level ratio), each with ``_tight`` / ``_loose`` second settings and an
``_upper`` TROLL arm; ``--stress`` adds per-arm collapse counts and the paired differences with 95 % intervals:

    .venv/bin/python scripts/bench_learning.py --model smollm2 --variants lr1e-4 gspo8 lr5e-5 --seeds 0 1 2 \
        --steps 10 --stress --results-dir benchmarks/results/stress_map --out-dir outputs/stress_map

    .venv/bin/python scripts/bench_learning.py --seeds 0 1 2 --steps 60
    .venv/bin/python scripts/bench_learning.py --model smollm2 --variants grpo grpo_upper --seeds 0 1 2 --steps 10
    .venv/bin/python scripts/bench_learning.py --model smollm2 --variants async1 async2 grpo8 --steps 10 \
        --out-dir outputs/bench_staleness_smollm2   # the staleness study

``grpo8``'s mini-batches follow from the model's batch (``UPDATES_PER_BATCH``, :func:`arm_overrides`).

``grpo_upper`` is TROLL with ``old_estimate=upper`` (no clip arm of its own: compare it with ``grpo``'s).

``bypass`` is TROLL in verl's bypass mode (:mod:`troll_verl.bypass.mode`: the old distribution is the vLLM rollout's
top-K, no old-log-prob pass), ``bypass_bf16`` the same with a bf16 rollout against the fp32 actor (a stand-in for a
GPU's train-inference mismatch); neither has a clip arm of its own: run them with ``grpo`` (TROLL recomputing the old
distribution, and clip), and the report adds their mismatch table:

    .venv/bin/python scripts/bench_learning.py --model smollm2 --variants grpo bypass bypass_bf16 --steps 10 \
        --out-dir outputs/bench_bypass_smollm2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time

from troll_verl.tools import late_decay
from troll_verl.tools.metrics_io import read_jsonl
from troll_verl.tools.paired_stats import T975 as _T975
from troll_verl.tools.paired_stats import fisher_exact_p, sign_flip_p, t_interval
from troll_verl.tools.plotting import smooth
from troll_verl.tools.quickstart import (
    MODELS,
    REWARD_KEY,
    VAL_KEY,
    cpu_model,
    cpu_run_overrides,
    micro_batch_size,
    reward_window,
    run_trainer,
)

# optimizer steps per batch of the arms that change the quickstart's 2 (the mini-batch follows from the model's batch)
UPDATES_PER_BATCH = {"grpo8": 8}
# actor learning rate of the arms that change the model's (the stress map's larger step sizes)
LEARNING_RATE: dict[str, float] = {}
# the variant whose clip arm a TROLL-only variant is compared with (same seeds, same data order)
BASELINE = {"grpo_upper": "grpo", "bypass": "grpo", "bypass_bf16": "grpo"}


def updates_overrides(updates: int, model) -> list[str]:
    """Mini-batch overrides that give ``updates`` optimizer steps per batch on ``model`` (a ``CPUModel``): the
    tiny model's 16 prompts in mini-batches of 2, SmolLM2's 8 in mini-batches of 1."""
    if model.batch_prompts % updates:
        raise ValueError(
            f"{model.name}: {model.batch_prompts} prompts per batch do not split into {updates} mini-batches"
        )
    mini = model.batch_prompts // updates
    return [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch_size(model, mini, model.n)}",
    ]


def arm_overrides(variant: str, loss: str, model) -> list[str]:
    """The overrides of one arm on ``model``: the variant's own, plus its update schedule where it sets one (its
    learning rate goes to :func:`~troll_verl.tools.quickstart.cpu_run_overrides`, ``LEARNING_RATE``)."""
    extra = updates_overrides(UPDATES_PER_BATCH[variant], model) if variant in UPDATES_PER_BATCH else []
    return VARIANTS[variant][loss] + extra


# bypass mode skips verl's old-log-prob pass, where verl measures actor/entropy: the update pass computes it instead
# (actor/entropy_loss, the current policy's entropy over the step's updates). NOTE: an extra entropy computation in the
# bypass arms' update that the recompute arms do not pay, so their step-time ratios against clip are conservative.
BYPASS = ["algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.actor.calculate_entropy=true"]


def _async(warmup_batches: int) -> list[str]:
    return [
        "trainer.v1.trainer_mode=troll_colocate_async",
        f"trainer.v1.colocate_async.num_warmup_batches={warmup_batches}",
    ]


VARIANTS = {
    "grpo": {
        "troll": ["actor_rollout_ref.actor.policy_loss.loss_mode=troll"],
        "clip": ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", "actor_rollout_ref.actor.clip_ratio=0.2"],
    },
    # the paper's update schedule: 8 optimizer steps per batch (there: 256 prompts, mini-batch 32), so later
    # mini-batches are off-policy and the trust region / clip has work to do
    # (mini-batches from UPDATES_PER_BATCH, see arm_overrides)
    "grpo8": {
        "troll": ["actor_rollout_ref.actor.policy_loss.loss_mode=troll"],
        "clip": ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", "actor_rollout_ref.actor.clip_ratio=0.2"],
    },
    # TROLL with the upper old-side estimate (troll_verl.core.old_side.old_side_estimate); its baseline is grpo's clip
    "grpo_upper": {
        "troll": [
            "actor_rollout_ref.actor.policy_loss.loss_mode=troll",
            "actor_rollout_ref.actor.policy_loss.old_estimate=upper",
        ],
    },
    # staleness: verl's colocate_async trainer generates 1 or 2 batches ahead (partial rollouts), so each batch was
    # sampled by a policy 1-2 updates older; both losses run through TROLL's trainer of that mode (with loss_mode=
    # vanilla it is exactly verl's), so they share the CPU platform's replay-buffer polling
    "async1": {
        "troll": ["actor_rollout_ref.actor.policy_loss.loss_mode=troll", *_async(1)],
        "clip": [
            "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
            "actor_rollout_ref.actor.clip_ratio=0.2",
            *_async(1),
        ],
    },
    "async2": {
        "troll": ["actor_rollout_ref.actor.policy_loss.loss_mode=troll", *_async(2)],
        "clip": [
            "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
            "actor_rollout_ref.actor.clip_ratio=0.2",
            *_async(2),
        ],
    },
    # bypass mode (troll_verl.bypass.mode): the old distribution is the vLLM rollout's top-K, no old-log-prob pass; its
    # baselines are grpo's arms (TROLL recomputing the old distribution, and clip), same seeds and data order
    "bypass": {"troll": ["actor_rollout_ref.actor.policy_loss.loss_mode=troll", *BYPASS]},
    # the same with a bf16 rollout against the fp32 actor: a stand-in for a GPU's train-inference mismatch
    "bypass_bf16": {
        "troll": [
            "actor_rollout_ref.actor.policy_loss.loss_mode=troll",
            *BYPASS,
            "actor_rollout_ref.rollout.dtype=bfloat16",
        ]
    },
    "gspo": {
        "troll": [
            "actor_rollout_ref.actor.policy_loss.loss_mode=troll",
            "actor_rollout_ref.actor.policy_loss.ratio_level=sequence",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        ],
        "clip": [
            "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            "actor_rollout_ref.actor.clip_ratio_low=0.2",
            "actor_rollout_ref.actor.clip_ratio_high=0.2",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        ],
    },
}


_LOSS_KEY = "actor_rollout_ref.actor.policy_loss"
_TROLL = f"{_LOSS_KEY}.loss_mode=troll"
_SEQ_MEAN = "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"


def _vanilla_clip(low: float, high: float) -> list[str]:
    # verl's actor config sets clip_ratio_low/high (0.2) explicitly, and they win over clip_ratio: set both sides
    return [
        f"{_LOSS_KEY}.loss_mode=vanilla",
        f"actor_rollout_ref.actor.clip_ratio_low={low}",
        f"actor_rollout_ref.actor.clip_ratio_high={high}",
    ]


def _gspo_clip(low: float, high: float) -> list[str]:
    return [
        f"{_LOSS_KEY}.loss_mode=gspo",
        f"actor_rollout_ref.actor.clip_ratio_low={low}",
        f"actor_rollout_ref.actor.clip_ratio_high={high}",
        _SEQ_MEAN,
    ]


def _regime(name: str, troll: list[str], clip: list[str], tight_clip: list[str], loose_clip: list[str]) -> dict:
    """A stress-map regime and its second settings (the names are ``name``, ``name_tight``, ``name_loose`` and
    ``name_upper``):

    - ``tight``: TROLL at ε = 0.02 and a narrower clip; ``loose``: TROLL at ε = 0.1 and a wider clip (for the token
      ratio DAPO's clip-higher, 0.2 / 0.28). The pre-stated rule picks one of the two per regime
      (docs/benchmarks.md, "Stress map");
    - ``upper``: TROLL with ``old_estimate=upper`` against the regime's own clip runs.
    """
    BASELINE[f"{name}_upper"] = name
    return {
        name: {"troll": troll, "clip": clip},
        f"{name}_tight": {"troll": [*troll, f"{_LOSS_KEY}.kl_bound=0.02"], "clip": tight_clip},
        f"{name}_loose": {"troll": [*troll, f"{_LOSS_KEY}.kl_bound=0.1"], "clip": loose_clip},
        f"{name}_upper": {"troll": [*troll, f"{_LOSS_KEY}.old_estimate=upper"]},
    }


# The stress map (docs/benchmarks.md, "Stress map"): where a trust region should matter.
# - lr<X>: GRPO as ``grpo`` at a larger actor learning rate (the model's is 2e-5);
# - gspo8: GSPO with verl's own GSPO clip range (3e-4 / 4e-4, the default of verl's gspo recipe) and 8 optimizer
#   steps per batch, against TROLL with the sequence-level ratio on the same schedule.
STRESS_LEARNING_RATES = {"lr3e-5": 3e-5, "lr5e-5": 5e-5, "lr7e-5": 7e-5, "lr1e-4": 1e-4}
STRESS_REGIMES = [*STRESS_LEARNING_RATES, "gspo8"]
_stress = {}
for _name, _lr in STRESS_LEARNING_RATES.items():
    _stress |= _regime(_name, [_TROLL], _vanilla_clip(0.2, 0.2), _vanilla_clip(0.1, 0.1), _vanilla_clip(0.2, 0.28))
    for _variant in (_name, f"{_name}_tight", f"{_name}_loose", f"{_name}_upper"):
        LEARNING_RATE[_variant] = _lr
_GSPO_TROLL = [_TROLL, f"{_LOSS_KEY}.ratio_level=sequence", _SEQ_MEAN]
_stress |= _regime("gspo8", _GSPO_TROLL, _gspo_clip(3e-4, 4e-4), _gspo_clip(1.5e-4, 2e-4), _gspo_clip(3e-3, 4e-3))
for _variant in ("gspo8", "gspo8_tight", "gspo8_loose", "gspo8_upper"):
    UPDATES_PER_BATCH[_variant] = 8
VARIANTS |= _stress

# The powered study (docs/benchmarks.md, "Powered study"): the paper's update schedule, 8 optimizer steps per batch.
# - paper8: TROLL (the paper's defaults) against clip as the paper ran it (0.2 both sides, dual-clip c = 10) and
#   verl's own trust region, DPPO-Binary-KL (`dppo_kl`; arXiv 2602.04879) with the KL threshold and truncation of
#   verl's example (examples/dppo_trainer/run_qwen3_30b_a3b_megatron.sh: dppo_kl 0.05, clip_ratio_c 10000).
#   NOTE: the example also switches to Dr.GRPO's aggregation; here every arm keeps token-mean and GRPO's std, so that
#   the arms differ only in the loss.
# - paper8_gspo: GSPO as the paper ran it (the sequence ratio clipped at 0.2 both ways) against TROLL with the
#   sequence-level ratio, the same aggregation and schedule.
DUAL_CLIP = "actor_rollout_ref.actor.clip_ratio_c"
VARIANTS["paper8"] = {
    "troll": [_TROLL],
    "clip": [*_vanilla_clip(0.2, 0.2), f"{DUAL_CLIP}=10.0"],
    "dppo": [
        f"{_LOSS_KEY}.loss_mode=dppo_kl",
        "actor_rollout_ref.actor.clip_ratio_low=0.05",
        "actor_rollout_ref.actor.clip_ratio_high=0.05",
        f"{DUAL_CLIP}=10000.0",
    ],
}
VARIANTS["paper8_gspo"] = {"troll": _GSPO_TROLL, "clip": _gspo_clip(0.2, 0.2)}
UPDATES_PER_BATCH |= {"paper8": 8, "paper8_gspo": 8}
# The late-decay study (docs/benchmarks.md, "Late-decay study"), stage 1, on the one-digit task (--task-hi 10) at the
# model's lr 2e-5: TROLL with the paper's defaults against clip 0.2 / 0.2 with verl's default dual-clip c = 3 (what a
# verl user runs unless they change it; paper8's clip uses the paper's c = 10), pinned so the run record names it.
VARIANTS["late8"] = {"troll": [_TROLL], "clip": [*_vanilla_clip(0.2, 0.2), f"{DUAL_CLIP}=3.0"]}
UPDATES_PER_BATCH["late8"] = 8


LENGTH_KEY = "response_length/mean"
# the stress map's collapse criterion on answers (tokens): a policy that answers in fewer has stopped answering
COLLAPSE_LENGTH = 4.0


def steps_to_target(rewards: list[float], target: float, window: int = 5) -> int | None:
    """The first step whose trailing ``window``-step mean reaches ``target`` (full windows only), else None."""
    means = smooth(rewards, window)
    return next((i + 1 for i in range(window - 1, len(means)) if means[i] >= target), None)


def _median_after_first(train: list[dict], key: str) -> float | None:
    values = [r[key] for r in train[1:] if key in r]  # step 1 carries one-off warm-up costs
    return statistics.median(values) if values else None


def _mean_of(train: list[dict], key: str) -> float | None:
    values = [r[key] for r in train if key in r]
    return statistics.mean(values) if values else None


def run_stats(rows: list[dict], target: float, val_key: str = VAL_KEY, peak_rss: int | None = None) -> dict:
    """One run's statistics from its metrics rows (the stress map's criteria: :func:`outcome`)."""
    train = [r for r in rows if REWARD_KEY in r]
    rewards = [r[REWARD_KEY] for r in train]
    val = [r[val_key] for r in rows if val_key in r]
    # the old-log-prob pass's entropy, or (bypass mode: no such pass) the update pass's
    entropy = [r.get("actor/entropy", r.get("actor/entropy_loss")) for r in train]
    entropy = [v for v in entropy if v is not None]
    lengths = [r[LENGTH_KEY] for r in train if LENGTH_KEY in r]
    # TROLL's projected share, or the share clip clipped (DPPO: the share its divergence mask dropped)
    constrained = [r.get("actor/troll/projected_frac", r.get("actor/pg_clipfrac")) for r in train]
    constrained = [v for v in constrained if v is not None]
    w_start, w_final = reward_window(len(train)), min(10, max(1, len(train) // 3))
    return {
        "constrained_frac": statistics.mean(constrained) if constrained else None,
        # how stale the data was: policy versions between sampling and training (verl's async trainers log it), and
        # verl's sampled-token estimate of KL(rollout policy || old policy), mean over steps
        "staleness": _mean_of(train, "training/off_policy/trajectory_staleness/mean"),
        "kl_rollout": _mean_of(train, "rollout_corr/kl"),
        # how far each update moved the policy from π_old before its optimizer step (verl's k1 estimate on the sampled
        # tokens, actor/ppo_kl, logged by both losses), mean over steps: more optimizer steps per batch raise it
        "kl_update": _mean_of(train, "actor/ppo_kl"),
        # bypass mode: the sparse KL between the rollout's and the actor's distributions before each step's first
        # update (the train-inference mismatch, plus staleness in the asynchronous trainers), and the share it projects
        "mismatch_kl_step1": train[0].get("actor/troll/mismatch_kl") if train else None,
        "mismatch_kl": _mean_of(train, "actor/troll/mismatch_kl"),
        "mismatch_projected": _mean_of(train, "actor/troll/mismatch_projected_frac"),
        "gen_s": _median_after_first(train, "timing_s/gen"),
        "old_log_prob_s": _median_after_first(train, "timing_s/old_log_prob"),
        "update_s": _median_after_first(train, "timing_s/update_actor"),
        "worker_peak_rss_gb": peak_rss / 2**30 if peak_rss else None,
        "steps": len(train),
        "steps_to_target": steps_to_target(rewards, target),
        "reward_step1": rewards[0],  # both losses sample step 1 from the same model: the paired sampling noise
        "reward_start": statistics.mean(rewards[:w_start]),
        "reward_final": statistics.mean(rewards[-w_final:]),
        "gain": statistics.mean(rewards[-w_final:]) - statistics.mean(rewards[:w_start]),
        "val_final": val[-1] if val else None,
        "entropy_final": statistics.mean(entropy[-w_final:]) if entropy else None,
        # mean answer length (tokens) over the last steps, verl's response_length/mean
        "length_final": statistics.mean(lengths[-w_final:]) if lengths else None,
        # the stress map's pre-stated criteria: collapsed when the final reward is below the step-1 reward or the
        # final answers are shorter than COLLAPSE_LENGTH tokens; learned when the final reward reaches the target
        "collapsed": bool(
            rewards
            and (
                statistics.mean(rewards[-w_final:]) < rewards[0]
                or (lengths and statistics.mean(lengths[-w_final:]) < COLLAPSE_LENGTH)
            )
        ),
        "learned": bool(rewards and statistics.mean(rewards[-w_final:]) >= target),
        # the powered study's primary outcome: mean train reward over every step of the run
        "reward_mean": statistics.mean(rewards) if rewards else None,
        # the powered study's added collapse rule: the trailing 5-step mean at the last step below half its peak
        "collapsed_peak": bool(rewards and _below_half_peak(rewards)),
        "seconds_per_step": _median_after_first(train, "timing_s/step"),
    }


def _below_half_peak(rewards: list[float], window: int = 5) -> bool:
    """Whether the trailing ``window``-step mean at the last step is below half of its largest value in the run."""
    means = smooth(rewards, window)[window - 1 :] or smooth(rewards, window)[-1:]
    return means[-1] < 0.5 * max(means)


def _fmt_steps(values: list[int | None], steps: int) -> str:
    return ", ".join(str(v) if v is not None else f">{steps}" for v in values)


def _mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def _ratio_cell(pairs, key) -> str:
    ratios = [t[key] / c[key] for t, c in pairs if t and c and t.get(key) and c.get(key)]
    return ", ".join(f"{r:.2f}" for r in ratios) if ratios else "n/a"


def report(results: dict, seeds: list[int], steps: int, target: float, variants=None) -> str:
    variants = variants or list(VARIANTS)
    w_start, w_final = reward_window(steps), min(10, max(1, steps // 3))
    lines = [
        f"target: trailing 5-step mean train reward >= {target}; seeds {seeds}; {steps} steps; "
        f"unreached counts as steps+1; gain: mean of the last {w_final} steps minus the first {w_start}",
        "",
        "| variant | loss | steps to target (per seed) | mean steps | step-1 reward (per seed) | gain | final reward "
        "| final val acc | final entropy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = {}
    for variant in variants:
        means = {}
        for loss in ("troll", "clip"):
            runs = [results.get(f"{variant}/{loss}/seed{s}") for s in seeds]
            runs = [r for r in runs if r is not None]
            if not runs:
                continue
            reached = [r["steps_to_target"] for r in runs]
            means[loss] = statistics.mean(v if v is not None else steps + 1 for v in reached)
            vals = [r["val_final"] for r in runs if r["val_final"] is not None]
            step1 = ", ".join(f"{r['reward_step1']:.3f}" for r in runs)
            lines.append(
                f"| {variant} | {loss} | {_fmt_steps(reached, steps)} | {means[loss]:.1f} | "
                f"{step1} | {_mean_sd([r['gain'] for r in runs])} | {_mean_sd([r['reward_final'] for r in runs])} | "
                f"{_mean_sd(vals) if vals else 'n/a'} | {_mean_sd([r['entropy_final'] for r in runs])} |"
            )
        if len(means) == 2:
            ratios[variant] = means["troll"] / means["clip"]
    lines += [
        "",
        "Cost, TROLL / clip per seed (median seconds over steps 2+; the trainer worker's peak resident "
        "memory); share of tokens projected (TROLL) or clipped (clip), mean over steps:",
        "",
        "| variant | generation | old-log-prob pass | update | step | worker peak memory | projected (TROLL) "
        "| clipped (clip) | staleness (steps) | KL(rollout ‖ old), TROLL / clip | KL(old ‖ current) in the "
        "update, TROLL / clip |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        pairs = [
            (results.get(f"{variant}/troll/seed{s}"), results.get(f"{_clip_variant(variant)}/clip/seed{s}"))
            for s in seeds
        ]
        if not any(t and c for t, c in pairs):
            continue
        troll_c = [t["constrained_frac"] for t, _ in pairs if t and t.get("constrained_frac") is not None]
        clip_c = [c["constrained_frac"] for _, c in pairs if c and c.get("constrained_frac") is not None]
        stale = [r["staleness"] for pair in pairs for r in pair if r and r.get("staleness") is not None]
        kl_cell, kl_update_cell = (_pair_mean_cell(pairs, key) for key in ("kl_rollout", "kl_update"))
        lines.append(
            f"| {variant} | {_ratio_cell(pairs, 'gen_s')} | {_ratio_cell(pairs, 'old_log_prob_s')} | "
            f"{_ratio_cell(pairs, 'update_s')} | {_ratio_cell(pairs, 'seconds_per_step')} | "
            f"{_ratio_cell(pairs, 'worker_peak_rss_gb')} | {_mean_sd(troll_c) if troll_c else 'n/a'} | "
            f"{_mean_sd(clip_c) if clip_c else 'n/a'} | {f'{statistics.mean(stale):.2f}' if stale else 'n/a'} | "
            f"{kl_cell} | {kl_update_cell} |"
        )
    mismatch = [(v, [results.get(f"{v}/troll/seed{s}") for s in seeds]) for v in variants]
    mismatch = [(v, [r for r in runs if r and r.get("mismatch_kl") is not None]) for v, runs in mismatch]
    if any(runs for _, runs in mismatch):
        lines += [
            "",
            "Train-inference mismatch in bypass mode (TROLL's sparse KL between the rollout's and the "
            "actor's distributions on each step's first micro-batch, before any update; per seed):",
            "",
            "| variant | step 1 | mean over steps | projected by the mismatch alone |",
            "|---|---|---|---|",
        ]
        for variant, runs in mismatch:
            if runs:
                step1 = ", ".join(f"{r['mismatch_kl_step1']:.2e}" for r in runs)
                mean = ", ".join(f"{r['mismatch_kl']:.2e}" for r in runs)
                lines.append(f"| {variant} | {step1} | {mean} | {_mean_sd([r['mismatch_projected'] for r in runs])} |")
    lines.append("")
    for variant, ratio in ratios.items():
        lines.append(f"{variant}: TROLL / clip mean steps to target = {ratio:.2f}")
    return "\n".join(lines)


def _pair_mean_cell(pairs, key) -> str:
    """``key``'s mean over seeds, TROLL / clip, from (troll, clip) run-statistics pairs."""
    values = [[p[i][key] for p in pairs if p[i] and p[i].get(key) is not None] for i in (0, 1)]
    return " / ".join(f"{statistics.mean(v):.2e}" if v else "n/a" for v in values)


def _clip_variant(variant: str) -> str:
    """The variant whose clip arm is ``variant``'s baseline (a TROLL-only variant borrows its ``BASELINE``'s)."""
    return variant if "clip" in VARIANTS[variant] else BASELINE[variant]


# ------------------------------------------------------------------------------------------------ raw results
# Each finished run keeps its per-step metrics, filtered to these keys, as verl file-logger JSONL
# (``<results-dir>/<variant>/<loss>/seed<k>.jsonl``, a few kB) and its run record beside it (``seed<k>.json``: peak
# memory, wall time, overrides, versions). Committed, they regenerate every table and plot (``--report-only``).
RAW_KEY_PREFIXES = (
    REWARD_KEY,
    "val-core/",
    "actor/entropy",
    "actor/troll/",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/grad_norm",
    "actor/pg_loss",
    LENGTH_KEY,
    "response_length/clip_ratio",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/old_log_prob",
    "timing_s/update_actor",
    "training/off_policy/",
    "rollout_corr/kl",
    "training/rollout_probs_diff_max",
)


def raw_path(results_dir: str, key: str) -> str:
    """``<results_dir>/<variant>/<loss>/seed<k>.jsonl`` for the run ``<variant>/<loss>/seed<k>``."""
    return os.path.join(results_dir, *key.split("/")) + ".jsonl"


def save_raw(results_dir: str, key: str, rows: list[dict], record: dict) -> str:
    """Write a finished run's filtered metrics and its record; atomically, so a stop midway leaves no half file."""
    path = raw_path(results_dir, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path[: -len(".jsonl")] + ".json", "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for row in rows:
            data = {k: v for k, v in row.items() if k != "step" and k.startswith(RAW_KEY_PREFIXES)}
            f.write(json.dumps({"step": row["step"], "data": data}, sort_keys=True) + "\n")
    os.replace(tmp, path)  # the metrics last: their presence marks the run finished
    return path


def load_raw(results_dir: str, key: str) -> tuple[list[dict], dict]:
    """A run's committed ``(rows, record)``; ``([], {})`` when it has not finished."""
    path = raw_path(results_dir, key)
    if not os.path.exists(path):
        return [], {}
    record_path = path[: -len(".jsonl")] + ".json"
    record = json.load(open(record_path)) if os.path.exists(record_path) else {}
    return read_jsonl(path), record


def collect(results_dir: str, plan, target: float, val_key: str, steps: int) -> dict:
    """Statistics of every planned ``(variant, loss, seed)`` whose raw results hold at least ``steps`` steps."""
    results = {}
    for variant, loss, seed in plan:
        key = f"{variant}/{loss}/seed{seed}"
        rows, record = load_raw(results_dir, key)
        if sum(1 for r in rows if REWARD_KEY in r) >= steps:
            peak = record.get("worker_peak_rss_gb")
            results[key] = run_stats(rows, target, val_key, int(peak * 2**30) if peak else None)
    return results


# two-sided 95 % quantiles of Student's t by degrees of freedom (paired intervals over a few seeds)
def bootstrap_interval(diffs: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile 95 % bootstrap interval of the mean of ``diffs`` (seeds resampled with replacement; a fixed
    generator, so a report regenerates to the same digits). With 3 seeds it has few distinct values: read it beside
    the t interval, not instead."""
    rng = random.Random(seed)
    means = sorted(statistics.mean(rng.choices(diffs, k=len(diffs))) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def _paired(results: dict, troll_key: str, clip_key: str, seeds: list[int], key: str = "reward_final"):
    """``(seeds, differences)`` of ``key``, TROLL arm minus clip arm, over the seeds both finished."""
    both = [s for s in seeds if f"{troll_key}/seed{s}" in results and f"{clip_key}/seed{s}" in results]
    return both, [results[f"{troll_key}/seed{s}"][key] - results[f"{clip_key}/seed{s}"][key] for s in both]


def _diff_row(label: str, seeds: list[int], diffs: list[float]) -> str:
    per_seed = ", ".join(f"{d:+.3f}" for d in diffs)
    if len(diffs) < 2:
        return f"| {label} | {len(diffs)} | {per_seed} | n/a | n/a | n/a |"
    mean, lo, hi = t_interval(diffs)
    b_lo, b_hi = bootstrap_interval(diffs)
    verdict = "yes" if lo > 0 or hi < 0 else "no"
    return (
        f"| {label} | {len(diffs)} | {per_seed} | {mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] | "
        f"[{b_lo:+.3f}, {b_hi:+.3f}] | {verdict} |"
    )


def _best_setting(results: dict, regime: str, loss: str, seeds: list[int]) -> str | None:
    """The regime setting (``regime``, ``_tight`` or ``_loose``) with ``loss``'s highest mean final reward over the
    seeds every measured setting finished."""
    settings = [v for v in (regime, f"{regime}_tight", f"{regime}_loose") if v in VARIANTS]
    measured = [v for v in settings if all(f"{v}/{loss}/seed{s}" in results for s in seeds)]
    if len(measured) < 2:
        return None
    return max(measured, key=lambda v: statistics.mean(results[f"{v}/{loss}/seed{s}"]["reward_final"] for s in seeds))


def stress_report(results: dict, seeds: list[int], steps: int, variants: list[str]) -> str:
    """The stress map's tables: per arm the pre-stated outcomes, and the paired differences TROLL − clip in final
    reward with their intervals (docs/benchmarks.md, "Stress map")."""
    lines = [
        "| variant | loss | seeds | final reward per seed | final reward | collapsed | learned | steps to target "
        "| held-out acc | entropy | answer length (tokens) | projected / clipped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        for loss in VARIANTS[variant]:
            runs = [results[f"{variant}/{loss}/seed{s}"] for s in seeds if f"{variant}/{loss}/seed{s}" in results]
            if not runs:
                continue
            reached = [r["steps_to_target"] if r["steps_to_target"] is not None else steps + 1 for r in runs]
            cells = []
            for k in ("val_final", "entropy_final", "length_final", "constrained_frac"):
                values = [r[k] for r in runs if r.get(k) is not None]
                cells.append(_mean_sd(values) if values else "n/a")
            per_seed = ", ".join(f"{r['reward_final']:.3f}" for r in runs)
            lines.append(
                f"| {variant} | {loss} | {len(runs)} | {per_seed} | "
                f"{_mean_sd([r['reward_final'] for r in runs])} | {sum(r['collapsed'] for r in runs)}/{len(runs)} | "
                f"{sum(r['learned'] for r in runs)}/{len(runs)} | {statistics.mean(reached):.1f} | "
                + " | ".join(cells)
                + " |"
            )
    lines += [
        "",
        "Paired differences in final reward (TROLL − clip unless named; same seed = same data order and "
        "first samples); 95 % intervals over seeds; separated = the t interval excludes 0:",
        "",
        "| comparison | seeds | per seed | mean | 95 % t interval | 95 % bootstrap | separated |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        if "clip" in VARIANTS[variant] and "troll" in VARIANTS[variant]:
            lines.append(_diff_row(variant, *_paired(results, f"{variant}/troll", f"{variant}/clip", seeds)))
        elif variant in BASELINE and VARIANTS[variant].keys() == {"troll"}:
            base = BASELINE[variant]
            lines.append(
                _diff_row(f"{variant} − {base}'s clip", *_paired(results, f"{variant}/troll", f"{base}/clip", seeds))
            )
            if "troll" in VARIANTS[base]:
                lines.append(
                    _diff_row(
                        f"{variant} − {base}'s TROLL (floor)",
                        *_paired(results, f"{variant}/troll", f"{base}/troll", seeds),
                    )
                )
    for regime in [v for v in variants if v in STRESS_REGIMES]:
        best = {loss: _best_setting(results, regime, loss, seeds) for loss in ("troll", "clip")}
        if all(best.values()):
            label = f"best of each in {regime}: TROLL {best['troll']} − clip {best['clip']} (chosen on these seeds)"
            lines.append(_diff_row(label, *_paired(results, f"{best['troll']}/troll", f"{best['clip']}/clip", seeds)))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ powered study
# docs/benchmarks.md, "Powered study": the plan (arms, seeds, n, outcomes, statistics, reading rules) was committed
# before the first run; these definitions apply it.
EFFECT = 0.1  # the difference the study is powered for, and the half-width of "no difference larger than"
PAPER_SCHEDULE = "under the paper's schedule"  # where stages 1-3 read an arm as learning faster


class Stage:
    """One stage of the powered study: its variant, losses, seeds, steps and paired comparisons (a, b: a − b).
    ``setting`` says where a reading has an arm learn faster; ``confirms`` names the earlier signal that an interval in
    TROLL's favour confirms and any other result withdraws (stage 4)."""

    def __init__(
        self,
        name,
        title,
        variant,
        losses,
        seeds,
        steps,
        comparisons,
        primary,
        test_freq,
        setting=PAPER_SCHEDULE,
        confirms=None,
    ):
        self.name, self.title, self.variant, self.losses = name, title, variant, losses
        self.seeds, self.steps, self.comparisons, self.primary = list(seeds), steps, comparisons, primary
        self.test_freq, self.setting, self.confirms = test_freq, setting, confirms

    def key(self, loss: str, seed: int) -> str:
        return f"{self.variant}/{loss}/seed{seed}"


STUDY = [
    Stage(
        "1",
        "TROLL vs clip, the paper's schedule",
        "paper8",
        ("troll", "clip"),
        range(15),
        30,
        [("troll", "clip")],
        "reward_mean",
        10,
    ),
    Stage(
        "2",
        "verl's DPPO-Binary-KL, paired with stage 1 on seeds 0-7",
        "paper8",
        ("troll", "clip", "dppo"),
        range(8),
        30,
        [("troll", "dppo"), ("dppo", "clip")],
        "reward_mean",
        10,
    ),
    Stage(
        "3",
        "GSPO as the paper ran it (sequence ratio clipped at 0.2)",
        "paper8_gspo",
        ("troll", "clip"),
        range(5),
        30,
        [("troll", "clip")],
        "collapses",
        10,
    ),
    Stage(
        "4",
        "the stress map's lr1e-4, fresh seeds",
        "lr1e-4",
        ("troll", "clip"),
        range(5, 19),
        10,
        [("troll", "clip")],
        "reward_mean",
        4,
        setting="at lr 1e-4",
        confirms="the stress map's lr 1e-4 signal (TROLL ahead in whole-run mean reward)",
    ),
]
STUDY_LABEL = {"troll": "TROLL", "clip": "clip", "dppo": "DPPO-KL"}


def t_power(n: int, sd: float, effect: float = EFFECT, draws: int = 20_000, seed: int = 0) -> float:
    """Power of the two-sided 95 % paired t test with ``n`` pairs to detect a true mean difference ``effect`` when the
    differences have standard deviation ``sd`` (normal differences; Monte Carlo with a fixed generator)."""
    if n < 2 or sd <= 0:
        return float("nan")
    rng, quantile, hits = random.Random(seed), _T975.get(n - 1, 1.96), 0
    for _ in range(draws):
        sample = [rng.gauss(effect, sd) for _ in range(n)]
        mean, half = statistics.mean(sample), quantile * statistics.stdev(sample) / math.sqrt(n)
        hits += mean - half > 0 or mean + half < 0
    return hits / draws


def adjusted_difference(diffs: list[float], covariate: list[float]) -> tuple[float, float, float]:
    """The intercept of the least-squares line of ``diffs`` on ``covariate`` (the difference at equal covariate) with
    its two-sided 95 % t interval (``n − 2`` degrees of freedom)."""
    n = len(diffs)
    if n < 3:
        raise ValueError(f"an adjusted difference needs at least 3 pairs, got {n}")
    mx, my = statistics.mean(covariate), statistics.mean(diffs)
    sxx = sum((x - mx) ** 2 for x in covariate)
    if sxx == 0:
        mean, lo, hi = t_interval(diffs)
        return mean, lo, hi
    slope = sum((x - mx) * (y - my) for x, y in zip(covariate, diffs, strict=True)) / sxx
    intercept = my - slope * mx
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(covariate, diffs, strict=True)) / (n - 2)
    se = math.sqrt(residual * (1 / n + mx**2 / sxx))
    half = _T975.get(n - 2, 1.96) * se
    return intercept, intercept - half, intercept + half


def reading(lo: float, hi: float, mean: float, a: str, b: str, power: float, setting: str = PAPER_SCHEDULE) -> str:
    """The plan's reading rule for a paired interval of ``a`` − ``b``."""
    if lo > 0 or hi < 0:
        winner = a if lo > 0 else b
        return f"{STUDY_LABEL[winner]} learned faster {setting} ({mean:+.3f} [{lo:+.3f}, {hi:+.3f}])"
    if -EFFECT < lo and hi < EFFECT:
        return f"no difference larger than {EFFECT} at this scale ({mean:+.3f} [{lo:+.3f}, {hi:+.3f}])"
    return f"inconclusive at this scale ({mean:+.3f} [{lo:+.3f}, {hi:+.3f}]; power {power:.0%} to detect ±{EFFECT})"


def collect_study(results_dir: str, target: float = 0.5) -> dict:
    """Run statistics of every finished run of every stage (``{stage.key(loss, seed): stats}``)."""
    results = {}
    for stage in STUDY:
        for loss in stage.losses:
            for seed in stage.seeds:
                key = stage.key(loss, seed)
                if key in results:  # stage 2 reuses stage 1's TROLL and clip runs
                    continue
                rows, record = load_raw(results_dir, key)
                if sum(1 for r in rows if REWARD_KEY in r) >= stage.steps:
                    peak = record.get("worker_peak_rss_gb")
                    val_key = record.get("val_key", MODELS["smollm2"].val_key)
                    results[key] = run_stats(rows, target, val_key, int(peak * 2**30) if peak else None)
    return results


def _cell(values: list[float], spec: str = ".3f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(statistics.mean(values), spec)} ± {format(statistics.stdev(values), spec)}"


def stage_complete(stage: Stage, results: dict) -> bool:
    """Whether every planned run of ``stage`` is in ``results`` (``collect_study``'s): the plan fixes n and allows no
    interim look, so neither the tables nor the plot show a stage before then."""
    return all(stage.key(loss, seed) in results for loss in stage.losses for seed in stage.seeds)


def study_report(results: dict) -> str:
    """The powered study's tables (docs/benchmarks.md, "Powered study"): per stage and arm the per-seed primary
    outcome and the secondary ones, then the paired comparisons with the reading the plan's rules give."""
    lines = []
    for stage in STUDY:
        done = {loss: [s for s in stage.seeds if stage.key(loss, s) in results] for loss in stage.losses}
        finished = ", ".join(f"{STUDY_LABEL[loss]} {len(done[loss])}/{len(stage.seeds)}" for loss in stage.losses)
        lines += [
            f"**Stage {stage.name}: {stage.title}** ({stage.variant}, seeds {stage.seeds[0]}-{stage.seeds[-1]}, "
            f"{stage.steps} steps; runs finished: {finished})",
            "",
        ]
        if not stage_complete(stage, results):
            lines += [
                "Not summarised until every planned run of the stage has finished (the plan: fixed n, no "
                "interim look).",
                "",
            ]
            continue
        lines += [
            "| arm | whole-run mean reward per seed | whole-run mean | final reward | held-out acc | "
            "entropy | collapsed | KL(old ‖ new) per update | projected / clipped / masked | step s |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for loss in stage.losses:
            runs = [results[stage.key(loss, s)] for s in done[loss]]
            if not runs:
                continue
            collapsed = sum(r["collapsed"] or r["collapsed_peak"] for r in runs)
            lines.append(
                f"| {STUDY_LABEL[loss]} | " + ", ".join(f"{r['reward_mean']:.3f}" for r in runs) + " | "
                f"{_cell([r['reward_mean'] for r in runs])} | {_cell([r['reward_final'] for r in runs])} | "
                f"{_cell([r['val_final'] for r in runs])} | {_cell([r['entropy_final'] for r in runs])} | "
                f"{collapsed}/{len(runs)} | {_cell([r['kl_update'] for r in runs], '.2e')} | "
                f"{_cell([r['constrained_frac'] for r in runs])} | "
                f"{_cell([r['seconds_per_step'] for r in runs], '.1f')} |"
            )
        lines += [
            "",
            "| comparison | pairs | primary: whole-run mean, per seed | mean | 95 % t interval | sign-flip p "
            "| SD | power for ±0.1 | final reward | entropy | entropy at equal final reward | step-1 reward "
            "equal | reading |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for a, b in stage.comparisons:
            seeds = [s for s in stage.seeds if stage.key(a, s) in results and stage.key(b, s) in results]
            ra, rb = [results[stage.key(a, s)] for s in seeds], [results[stage.key(b, s)] for s in seeds]
            diffs = [x["reward_mean"] - y["reward_mean"] for x, y in zip(ra, rb, strict=True)]
            mean, lo, hi = t_interval(diffs)
            sd = statistics.stdev(diffs)
            power = t_power(len(diffs), sd)
            final = [x["reward_final"] - y["reward_final"] for x, y in zip(ra, rb, strict=True)]
            f_mean, f_lo, f_hi = t_interval(final)
            entropy = [x["entropy_final"] - y["entropy_final"] for x, y in zip(ra, rb, strict=True)]
            e_mean, e_lo, e_hi = t_interval(entropy)
            adj, adj_lo, adj_hi = adjusted_difference(entropy, final)
            same_step1 = sum(abs(x["reward_step1"] - y["reward_step1"]) < 1e-9 for x, y in zip(ra, rb, strict=True))
            lines.append(
                f"| {STUDY_LABEL[a]} − {STUDY_LABEL[b]} | {len(diffs)} | "
                + ", ".join(f"{d:+.3f}" for d in diffs)
                + f" | {mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {sign_flip_p(diffs):.4f} | {sd:.3f} | {power:.0%} | "
                f"{f_mean:+.3f} [{f_lo:+.3f}, {f_hi:+.3f}] | {e_mean:+.3f} [{e_lo:+.3f}, {e_hi:+.3f}] | "
                f"{adj:+.3f} [{adj_lo:+.3f}, {adj_hi:+.3f}] | {same_step1}/{len(diffs)} | "
                f"{reading(lo, hi, mean, a, b, power, stage.setting)} |"
            )
            if stage.confirms:
                verdict = "confirmed" if a == "troll" and lo > 0 else "withdrawn"
                lines += [
                    "",
                    f"Primary outcome of this stage: {stage.confirms} {verdict} ({STUDY_LABEL[a]} − "
                    f"{STUDY_LABEL[b]} {mean:+.3f} [{lo:+.3f}, {hi:+.3f}]; the plan: an interval that excludes "
                    "0 in TROLL's favour confirms it, any other result withdraws it).",
                ]
            if stage.primary == "collapses":
                ca = sum(x["collapsed"] or x["collapsed_peak"] for x in ra)
                cb = sum(y["collapsed"] or y["collapsed_peak"] for y in rb)
                p = fisher_exact_p(ca, len(ra), cb, len(rb))
                verdict = (
                    f"{STUDY_LABEL[a] if ca < cb else STUDY_LABEL[b]} collapsed less"
                    if p < 0.05
                    else "no difference in collapses detected"
                )
                lines += [
                    "",
                    f"Primary outcome of this stage, collapses: {STUDY_LABEL[a]} {ca}/{len(ra)}, "
                    f"{STUDY_LABEL[b]} {cb}/{len(rb)}, Fisher exact p = {p:.3f}: {verdict}.",
                ]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# the studies --study reports: the powered study (--study alone) and the late-decay study's stage 1
STUDIES = ("powered", "late_decay")


def study_block(study: str) -> re.Pattern:
    """The docs block of ``study``'s tables: ``<!-- report: <its --study command> -->`` ... ``<!-- end report -->``
    (the powered study's command is ``--study`` followed by another option or nothing)."""
    flag = r"--study late_decay\b" if study == "late_decay" else r"--study(?= --| -->)"
    return re.compile(rf"(<!-- report: [^\n]*{flag}[^\n]* -->\n)(.*?)(<!-- end report -->)", flags=re.S)


def write_study_docs(path: str, report: str, study: str = "powered") -> int:
    """Rewrite, in the Markdown file ``path``, every block between ``<!-- report: <study's --study command> -->`` and
    ``<!-- end report -->`` with ``report`` (what that command prints); returns the number of blocks rewritten.
    tests/tools/test_benchmarks_on_cpu.py checks that the committed blocks are what the command prints today."""
    with open(path) as f:
        text = f.read()
    new, count = study_block(study).subn(lambda m: m.group(1) + "\n" + report + "\n" + m.group(3), text)
    command = "--study" if study == "powered" else f"--study {study}"
    if count == 0:
        raise SystemExit(
            f"--docs {path}: no '<!-- report: ... {command} ... -->' ... '<!-- end report -->' block; "
            f"add one whose marker names the {command} command, where the tables belong"
        )
    if new != text:
        with open(path + ".tmp", "w") as f:
            f.write(new)
        os.replace(path + ".tmp", path)
    return count


def plot_curves(results_dir: str, variants: list[str], seeds: list[int], path: str, title: str) -> str:
    """Train reward (trailing 3-step mean) against step, from the raw results: per variant one panel, a thin line per
    seed and the mean over seeds thick, TROLL and clip."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(len(variants), 4)
    rows_of_panels = -(-len(variants) // columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(5 * columns, 3.6 * rows_of_panels), squeeze=False)
    for ax in axes.flat[len(variants) :]:
        ax.set_visible(False)
    colors = {"troll": "tab:blue", "clip": "tab:orange"}
    for ax, variant in zip(axes.flat, variants, strict=False):
        arms = [(variant, loss) for loss in VARIANTS[variant]]
        if "clip" not in VARIANTS[variant]:
            arms.append((_clip_variant(variant), "clip"))
        for arm_variant, loss in arms:
            curves = []
            for seed in seeds:
                rows, _ = load_raw(results_dir, f"{arm_variant}/{loss}/seed{seed}")
                rewards = [r[REWARD_KEY] for r in rows if REWARD_KEY in r]
                if rewards:
                    curves.append(smooth(rewards, 3))
                    ax.plot(range(1, len(rewards) + 1), curves[-1], color=colors[loss], alpha=0.25, lw=1)
            if curves:
                n = min(len(c) for c in curves)
                mean = [statistics.mean(c[i] for c in curves) for i in range(n)]
                label = ("TROLL" if loss == "troll" else "clip") + (
                    "" if arm_variant == variant else f" ({arm_variant})"
                )
                ax.plot(range(1, n + 1), mean, color=colors[loss], lw=2.2, label=label)
        ax.set_title(variant)
        ax.set_xlabel("step")
        ax.set_ylabel("train reward (3-step mean)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def study_panels(results: dict) -> list[list[tuple[Stage, str]]]:
    """The study plot's grid: a row per variant, a panel per arm, each arm in the first stage that has it (stage 2
    reuses stage 1's TROLL and clip) and only once that stage is complete (``stage_complete``)."""
    rows: dict[str, list[tuple[Stage, str]]] = {}
    seen = set()
    for stage in STUDY:
        for loss in stage.losses:
            if (stage.variant, loss) not in seen and stage_complete(stage, results):
                rows.setdefault(stage.variant, []).append((stage, loss))
            seen.add((stage.variant, loss))
    return list(rows.values())


def plot_study(results_dir: str, results: dict, path: str) -> str:
    """Train reward against step, a panel per arm of the powered study (a row per variant, `study_panels`): a faint
    line per seed, the mean bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = study_panels(results)
    if not grid:
        return "no stage complete yet: nothing drawn"
    columns = max(len(row) for row in grid)
    fig, axes = plt.subplots(len(grid), columns, figsize=(4.2 * columns, 3.2 * len(grid)), squeeze=False, sharey=True)
    panels = []
    for row, ax_row in zip(grid, axes, strict=True):
        panels += zip(ax_row, row, strict=False)
        for ax in ax_row[len(row) :]:
            ax.set_visible(False)
    colors = {"troll": "tab:blue", "clip": "tab:orange", "dppo": "tab:green"}
    for ax, (stage, loss) in panels:
        curves = []
        for seed in stage.seeds:
            rows, _ = load_raw(results_dir, stage.key(loss, seed))
            rewards = [r[REWARD_KEY] for r in rows if REWARD_KEY in r]
            if rewards:
                curves.append(rewards)
                ax.plot(range(1, len(rewards) + 1), rewards, color=colors[loss], alpha=0.2, lw=0.8)
        if curves:
            n = min(len(c) for c in curves)
            ax.plot(
                range(1, n + 1), [statistics.mean(c[i] for c in curves) for i in range(n)], color=colors[loss], lw=2.4
            )
        ax.set_title(f"stage {stage.name}: {stage.variant}, {STUDY_LABEL[loss]} ({len(curves)} seeds)", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("train reward")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    """The command line (the docs' commands for this script are parsed with it: tests/tools/test_docs_on_cpu.py)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--target", type=float, default=0.5)
    default_variants = [v for v in VARIANTS if v in ("grpo", "grpo8", "grpo_upper", "gspo")]
    parser.add_argument(
        "--variants",
        nargs="+",
        default=default_variants,
        choices=list(VARIANTS),
        help=f"default: {' '.join(default_variants)}",
    )
    parser.add_argument("--out-dir", default="outputs/bench_learning", help="the runs' logs and full metrics")
    parser.add_argument(
        "--results-dir",
        default=None,
        help="finished runs' filtered per-step metrics, the input of every table and plot (commit "
        "it; default: <out-dir>/raw)",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing: print the tables (and --plot) from --results-dir"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run nothing: check every planned run's config with TROLL's dry run (no Ray, no model)",
    )
    parser.add_argument(
        "--stress",
        action="store_true",
        help="add the stress map's tables: collapses, and paired differences with 95 %% intervals",
    )
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--model", default="tiny", choices=list(MODELS))
    parser.add_argument(
        "--task-hi",
        type=int,
        default=None,
        help="smollm2: addition with operands in [0, TASK_HI) (default: one-digit sums)",
    )
    losses = sorted({loss for arms in VARIANTS.values() for loss in arms})
    parser.add_argument(
        "--losses",
        nargs="+",
        default=None,
        choices=losses,
        help="run only these arms of each variant (default: all of them)",
    )
    parser.add_argument(
        "--test-freq", type=int, default=None, help="greedy validation every so many steps (default: the model's)"
    )
    parser.add_argument(
        "--study",
        nargs="?",
        const="powered",
        default=None,
        choices=STUDIES,
        help="run nothing: print a study's tables from --results-dir: the powered study's (and --plot) with --study "
        "alone, the late-decay study's stage 1 with --study late_decay (before its interim look only the progress)",
    )
    parser.add_argument(
        "--docs",
        default=None,
        help="with --study: also write the tables into this Markdown file, replacing its block "
        "between '<!-- report: <the --study command> -->' and '<!-- end report -->'",
    )
    parser.add_argument("--plot", default=None, help="write the reward curves here (PNG)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.docs and not args.study:
        parser.error("--docs writes a study's tables: add --study (or --study late_decay)")
    if args.plot and args.study == "late_decay":
        parser.error("--plot draws the powered study's curves; the late-decay report has none: drop --plot")

    model = cpu_model(args.model, args.task_hi)
    results_dir = args.results_dir or os.path.join(args.out_dir, "raw")
    if args.study:
        results = collect_study(results_dir) if args.study == "powered" else None
        tables = study_report(results) if results is not None else late_decay.report(results_dir)
        print(tables)
        if args.docs:
            print(f"docs: {write_study_docs(args.docs, tables, args.study)} block(s) of {args.docs} rewritten")
        if args.plot:
            print("plot: " + plot_study(results_dir, results, args.plot))
        return 0
    plan = [
        (v, loss, s)
        for s in args.seeds
        for v in args.variants
        for loss in VARIANTS[v]
        if args.losses is None or loss in args.losses
    ]
    if args.dry_run:
        return _dry_run_plan(plan, model, args)
    if not args.report_only:
        code = _run_plan(plan, model, args, results_dir)
        if code:
            return code
    results = collect(results_dir, plan, args.target, model.val_key, args.steps)
    missing = [f"{v}/{loss}/seed{s}" for v, loss, s in plan if f"{v}/{loss}/seed{s}" not in results]
    if missing:
        print(f"not in {results_dir} (not run, or fewer than {args.steps} steps): {' '.join(missing)}\n")
    print(report(results, args.seeds, args.steps, args.target, args.variants))
    if args.stress:
        print()
        print(stress_report(results, args.seeds, args.steps, args.variants))
    if args.plot:
        print(
            "\nplot: "
            + plot_curves(
                results_dir,
                args.variants,
                args.seeds,
                args.plot,
                f"GRPO on the {model.name} model's task, seeds {args.seeds}",
            )
        )
    return 0


def _run_overrides(model, assets, args, variant: str, loss: str, seed: int) -> list[str]:
    key = f"{variant}/{loss}/seed{seed}"
    run_dir = os.path.join(args.out_dir, variant, loss, f"seed{seed}")
    return cpu_run_overrides(
        model,
        assets,
        steps=args.steps,
        seed=seed,
        run_dir=run_dir,
        experiment=key.replace("/", "_"),
        lr=LEARNING_RATE.get(variant),
        test_freq=args.test_freq,
    ) + arm_overrides(variant, loss, model)


def _dry_run_plan(plan, model, args) -> int:
    """Every planned run's command through ``python -m troll_verl.tools.dry_run`` (one process, CPU platform)."""
    import tempfile

    assets = model.build(args.cache_dir)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for variant, loss, seed in plan:
            path = os.path.join(tmp, f"{variant}.{loss}.seed{seed}")
            command = ["-m", "troll_verl.main", *_run_overrides(model, assets, args, variant, loss, seed)]
            with open(path, "wb") as f:
                f.write(b"".join(part.encode() + b"\0" for part in command))
            files.append(path)
        env = {**os.environ, "VERL_PLATFORM": "cpu"}
        return subprocess.run([sys.executable, "-m", "troll_verl.tools.dry_run", *files], env=env).returncode


def _run_plan(plan, model, args, results_dir: str) -> int:
    """Run every planned arm not yet in ``results_dir``, seed by seed; each finished run is saved at once."""
    assets = None
    for index, (variant, loss, seed) in enumerate(plan, 1):
        key = f"{variant}/{loss}/seed{seed}"
        rows, _ = load_raw(results_dir, key)
        if sum(1 for r in rows if REWARD_KEY in r) >= args.steps:
            print(f"[{index}/{len(plan)}] {key}: reusing finished run ({raw_path(results_dir, key)})", flush=True)
            continue
        assets = assets or model.build(args.cache_dir)
        print(f"[{index}/{len(plan)}] {key}: running {args.steps} steps ...", flush=True)
        run_dir = os.path.join(args.out_dir, variant, loss, f"seed{seed}")
        start = time.perf_counter()
        overrides = _run_overrides(model, assets, args, variant, loss, seed)
        result = run_trainer(overrides, run_dir, track_memory=True)
        if result.returncode != 0:
            print(f"  failed (exit {result.returncode}); see {result.log_path}", file=sys.stderr)
            record_failed_attempt(results_dir, key, result.returncode, result.log_path, time.perf_counter() - start)
            return 1
        wall = time.perf_counter() - start
        peak = result.worker_peak_rss_bytes
        record = {
            "key": key,
            "model": model.name,
            "steps": args.steps,
            "wall_s": round(wall, 1),
            "worker_peak_rss_gb": peak / 2**30 if peak else None,
            "overrides": overrides,
            "task_hi": args.task_hi,
            "val_key": model.val_key,
            "date": time.strftime("%Y-%m-%d"),
            **_versions(),
        }
        save_raw(results_dir, key, result.rows(), record)
        r = run_stats(result.rows(), args.target, model.val_key, peak)
        print(
            f"  done in {wall:.0f} s: reward {r['reward_start']:.3f} -> {r['reward_final']:.3f}, steps to "
            f"target {r['steps_to_target']}, collapsed {r['collapsed']}",
            flush=True,
        )
    return 0


FAILED_ATTEMPTS = "failed_attempts.jsonl"


def record_failed_attempt(results_dir: str, key: str, returncode: int, log_path: str, wall_s: float) -> str:
    """Append a failed run to ``<results_dir>/failed_attempts.jsonl`` (one JSON line: the run, its exit code, the
    last lines of its log, the code and whether the tree was clean), so the study records every attempt."""
    try:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-2000:]
    except OSError:
        tail = None
    entry = {
        "key": key,
        "returncode": returncode,
        "wall_s": round(wall_s, 1),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "log_tail": tail,
        **_versions(),
    }
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, FAILED_ATTEMPTS)
    with open(path, "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    return path


def _versions() -> dict:
    """The code and library versions a run record names."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("verl", "vllm", "torch"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out["commit"] = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        # whether the code that ran is exactly that commit (untracked files outside the package aside)
        status = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        out["tree_clean"] = status.strip() == ""
    except (OSError, subprocess.CalledProcessError):
        out["commit"] = None
        out["tree_clean"] = None
    return out


if __name__ == "__main__":
    sys.exit(main())
