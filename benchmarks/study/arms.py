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
"""The learning benchmark's arms: for each variant, the overrides of its TROLL and clip (and DPPO) runs on top of the
quickstart's configuration for a model, their update schedule and learning rate, and the baseline a TROLL-only variant
is compared with."""

from __future__ import annotations

from troll_verl.tools.quickstart import micro_batch_size

__all__ = [
    "VARIANTS",
    "UPDATES_PER_BATCH",
    "LEARNING_RATE",
    "BASELINE",
    "STRESS_LEARNING_RATES",
    "STRESS_REGIMES",
    "DUAL_CLIP",
    "updates_overrides",
    "arm_overrides",
    "clip_variant",
]

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
        "trainer.v1.trainer_mode=colocate_async",
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
    # sampled by a policy 1-2 updates older; both losses run on verl's trainer of that mode (the CPU platform's
    # replay buffer, platform/cpu.py)
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


def clip_variant(variant: str) -> str:
    """The variant whose clip arm is ``variant``'s baseline (a TROLL-only variant borrows its ``BASELINE``'s)."""
    return variant if "clip" in VARIANTS[variant] else BASELINE[variant]


# After mastery (docs/benchmarks.md, "After mastery"): probes of the late-decay setting on exploratory seeds (300-349),
# each late8's TROLL with one change, read against late8's own TROLL and clip runs on the same seeds:
# - probe_a0: no regression term (α = 0): what the regression adds to the gradient (H1);
# - probe_upper: the upper old-side estimate: what the floor's spurious projection costs (H3);
# - probe_noproj: a bound no token reaches (ε = 1000): TROLL's unclipped importance ratio alone (H4).
VARIANTS["probe_a0"] = {"troll": [_TROLL, f"{_LOSS_KEY}.alpha=0.0"]}
VARIANTS["probe_upper"] = {"troll": [_TROLL, f"{_LOSS_KEY}.old_estimate=upper"]}
VARIANTS["probe_noproj"] = {"troll": [_TROLL, f"{_LOSS_KEY}.kl_bound=1000.0"]}
for _variant in ("probe_a0", "probe_upper", "probe_noproj"):
    UPDATES_PER_BATCH[_variant] = 8
    BASELINE[_variant] = "late8"
# Probe P2 (docs/benchmarks.md, "After mastery"): 30-step runs with TROLL's diagnostics on (troll_verl/integration/
# diagnostics.py), the paper's TROLL and the candidate remedies, read against late8's clip on the same seeds:
# - probe_diag: late8's TROLL, diagnostics on (the control: the mastered phase's signature);
# - cand_adv: the regression only on tokens with a non-zero advantage (regression=advantage; a departure, H1);
# - cand_upper: the upper old-side estimate (H3); cand_a0: no regression term at all (α = 0; H1 and H2).
_DIAGNOSTICS = f"{_LOSS_KEY}.diagnostics=true"
VARIANTS["probe_diag"] = {"troll": [_TROLL, _DIAGNOSTICS]}
VARIANTS["cand_adv"] = {"troll": [_TROLL, f"{_LOSS_KEY}.regression=advantage", _DIAGNOSTICS]}
VARIANTS["cand_upper"] = {"troll": [_TROLL, f"{_LOSS_KEY}.old_estimate=upper", _DIAGNOSTICS]}
VARIANTS["cand_a0"] = {"troll": [_TROLL, f"{_LOSS_KEY}.alpha=0.0", _DIAGNOSTICS]}
for _variant in ("probe_diag", "cand_adv", "cand_upper", "cand_a0"):
    UPDATES_PER_BATCH[_variant] = 8
    BASELINE[_variant] = "late8"
