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
"""The GPU check (``bash scripts/gpu_check.sh``, which sets up the path and runs this): every stage on one CUDA GPU,
each in its own process under its own time limit, so one failing stage never hides the others' results.

Stages:

- ``env``: the machine (GPU, driver, torch, CUDA, verl, transformers).
- ``core``: the numerical core's tests (float64 gradchecks, brute-force references, the bound) with the core's
  functions on CUDA (``TROLL_TEST_DEVICE=cuda``, ``tests/conftest.py``).
- ``bench_loss``: ``scripts/bench_loss.py`` at Qwen3-4B and Qwen3-8B shapes (N = 8192, H = 2560 and 4096,
  V = 151936), bf16 and fp32: time and peak memory, TROLL / clip.
- ``engine``: one TROLL and one clip update through verl's FSDP2 engine (TROLL's actor worker, bf16 parameters) on a
  small random-weight Qwen3-shaped model (vocabulary 151936): the bound held, step time and peak memory TROLL / clip.

Writes ``gpu_check.json`` (everything), ``gpu_check.md`` (the tables) and ``gpu_check.log`` (every stage's output) to
``--out``, intermediate files to ``--work`` (a temporary folder); exits 1 if a stage failed.

    bash scripts/gpu_fetch.sh            # on a machine with network, once
    bash scripts/gpu_check.sh            # on the GPU machine (device tool: carry [".whl"])
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE_TESTS = [
    *(f"tests/core/test_{name}_on_cpu.py" for name in ("projection", "sparse", "losses", "variants")),
    *(f"tests/ablations/test_{name}_on_cpu.py" for name in ("solvers", "tails", "old_estimates")),
]
QWEN3_SHAPES = ["8192x2560x151936", "8192x4096x151936"]  # Qwen3-4B and -8B: N x H x V
STAGE_LIMIT_S = {"env": 60, "core": 200, "bench_loss": 180, "engine": 180}


# --------------------------------------------------------------------------------------------------------- stages
def stage_env(out_dir: str) -> dict:
    import torch

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    for dist in ("verl", "transformers", "tensordict"):
        try:
            from importlib.metadata import version

            info[dist] = version(dist)
        except Exception as exc:  # noqa: BLE001 - a missing package is a finding, not a crash
            info[dist] = f"missing ({type(exc).__name__})"
    try:
        info["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["driver"] = None
    return info


def stage_core(out_dir: str) -> dict:
    """The core's tests with its functions on CUDA; pass/fail counts and the failing tests' names."""
    env = {**os.environ, "TROLL_TEST_DEVICE": "cuda"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *CORE_TESTS]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=STAGE_LIMIT_S["core"] - 10)
    with open(os.path.join(out_dir, "core_tests.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    return {
        **parse_pytest_summary(proc.stdout),
        "returncode": proc.returncode,
        "failed_tests": re.findall(r"^FAILED (\S+)", proc.stdout, re.M),
    }


def parse_pytest_summary(text: str) -> dict:
    """``{"passed": n, "failed": n, "skipped": n, "errors": n}`` from pytest's last summary line."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    lines = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1] if lines else ""):
        counts["errors" if word.startswith("error") else word] = int(n)
    return counts


def stage_bench_loss(out_dir: str) -> dict:
    path, table = os.path.join(out_dir, "bench_loss.json"), os.path.join(out_dir, "bench_loss.md")
    cmd = [
        sys.executable,
        "scripts/bench_loss.py",
        "--device",
        "cuda",
        "--shapes",
        *QWEN3_SHAPES,
        "--dtypes",
        "bf16,fp32",
        "--repeats",
        "5",
        "--skip-verl-baseline",
        "--json",
        path,
        "--markdown",
        table,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=STAGE_LIMIT_S["bench_loss"] - 10)
    with open(os.path.join(out_dir, "bench_loss.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_loss.py exited {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}")
    with open(path) as f, open(table) as g:
        return {**json.load(f), "table": g.read()}


def stage_engine(out_dir: str) -> dict:
    """One update per loss through verl's FSDP2 engine on this GPU: TROLL (bound held?) and verl's vanilla clip, the
    same model, batch and old pass; update seconds and peak allocated memory.

    ``GPU_CHECK_ENGINE=tiny`` runs the same code on the CPU platform with a tiny model (a check of this stage's code
    before a GPU is lent; its numbers mean nothing).
    """
    import torch

    tiny = os.environ.get("GPU_CHECK_ENGINE") == "tiny"
    if tiny:
        os.environ["VERL_PLATFORM"] = "cpu"  # before verl is imported
    import torch.distributed as dist
    from verl.utils import tensordict_utils as tu

    import troll_verl.integration.plugin  # noqa: F401 - registers TROLL's loss, and the CPU platform where selected
    from troll_verl.testing.verl_engine import (
        CPU_OVERRIDES,
        compose_config,
        free_port,
        make_batch,
        old_pass,
        tiny_model_dir,
        update_batch,
    )

    vocab, hidden, layers, seqs, prompt, response = (128, 64, 2, 4, 8, 24) if tiny else (151936, 1024, 4, 16, 64, 448)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo" if tiny else "nccl", rank=0, world_size=1)
    if not tiny:
        torch.cuda.set_device(0)
    sync = (lambda: None) if tiny else torch.cuda.synchronize
    model_dir = tiny_model_dir(
        os.path.join(out_dir, "qwen3_random"),
        vocab=vocab,
        layers=layers,
        hidden=hidden,
        heads=16 if not tiny else 2,
        arch="qwen3",
        head_scale=8.0,
    )
    batch = make_batch(vocab, [prompt] * seqs, [response] * seqs, seed=0)
    adv = torch.randn(seqs, response, generator=torch.Generator().manual_seed(0))
    results = {
        "model": f"Qwen3-shaped, {layers} layers, hidden {hidden}, vocabulary {vocab}, random weights",
        "tokens_per_update": seqs * (prompt + response),
        "parameters": "fp32, CPU platform" if tiny else "bf16 (verl's default mixed precision)",
    }
    for loss in ("troll", "clip"):
        overrides = [
            f"actor_rollout_ref.actor.policy_loss.loss_mode={'troll' if loss == 'troll' else 'vanilla'}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={seqs}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={seqs}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={seqs}",
        ]
        config = compose_config(model_dir, *ENGINE_OVERRIDES, *overrides, base=CPU_OVERRIDES if tiny else GPU_BASE)
        worker = _actor_worker(config)
        old = old_pass(worker, batch, 1.0, store=loss == "troll")
        times, peaks, metrics = [], [], None
        for _ in range(3):  # the first is warm-up (allocator, kernels); the better of the other two is reported
            data = update_batch(batch, old, adv, 1.0, mini_batch_size=seqs, troll=loss == "troll")
            sync()
            if not tiny:
                torch.cuda.reset_peak_memory_stats()
            base = 0 if tiny else torch.cuda.memory_allocated()
            start = time.perf_counter()
            metrics = tu.get(worker.update_actor(data), "metrics")
            sync()
            times.append(time.perf_counter() - start)
            peaks.append(0 if tiny else torch.cuda.max_memory_allocated() - base)
        results[loss] = {
            "update_s": min(times[1:]),
            "peak_gib": max(peaks[1:]) / 2**30,
            "metrics": {k: v for k, v in metrics.items() if k.startswith(("troll/", "actor/", "loss"))},
        }
        del worker
        if not tiny:
            torch.cuda.empty_cache()
    troll_metrics = results["troll"]["metrics"]
    results["projected_frac"] = max(troll_metrics["troll/projected_frac"])
    results["bound_held"] = max(troll_metrics["troll/bound_violation_max"]) == 0.0
    results["time_ratio"] = results["troll"]["update_s"] / results["clip"]["update_s"]
    results["mem_ratio"] = results["troll"]["peak_gib"] / results["clip"]["peak_gib"] if not tiny else None
    dist.destroy_process_group()
    return results


# verl's FSDP2 engine on one GPU: verl's default mixed precision (bf16 parameters), sdpa attention (no flash-attn on a
# bare machine), no torch.compile (its start-up would dominate one update)
GPU_BASE = [
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.enable_gradient_checkpointing=False",
]
# both devices: one response-token micro-batch per update, a tight bound so that TROLL projects
ENGINE_OVERRIDES = [
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.actor.optim.lr=1e-5",
    "actor_rollout_ref.actor.policy_loss.kl_bound=0.01",
]


def _actor_worker(config):
    """verl's actor worker, whose training worker is TROLL's (installed by the plugin, imported first)."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    import troll_verl.integration.plugin  # noqa: F401

    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    return worker


STAGES = {"env": stage_env, "core": stage_core, "bench_loss": stage_bench_loss, "engine": stage_engine}


# --------------------------------------------------------------------------------------------------------- report
def render_markdown(report: dict) -> str:
    """The check's tables: the stages' status, the loss benchmark and the engine update, TROLL / clip."""
    env = report.get("env", {}).get("result") or {}
    lines = [
        f"GPU check, {report.get('date', '?')}: {env.get('gpu', '?')} ({env.get('gpu_memory_gib', '?')} GiB), "
        f"driver {env.get('driver', '?')}, torch {env.get('torch', '?')} (CUDA {env.get('cuda', '?')}), "
        f"verl {env.get('verl', '?')}, transformers {env.get('transformers', '?')}",
        "",
        "| stage | status | seconds | detail |",
        "|---|---|---|---|",
    ]
    for name in STAGES:
        stage = report.get(name)
        if stage is None:
            lines.append(f"| {name} | not run | | |")
            continue
        lines.append(f"| {name} | {stage['status']} | {stage['seconds']:.0f} | {_detail(name, stage)} |")
    bench = (report.get("bench_loss") or {}).get("result")
    if bench:
        lines += [
            "",
            "Loss step (`scripts/bench_loss.py`), TROLL / clip, medians of paired ratios:",
            "",
            bench["table"].rstrip(),
        ]
    engine = (report.get("engine") or {}).get("result")
    if engine:
        lines += [
            "",
            f"One update through verl's FSDP2 engine ({engine['model']}, {engine['tokens_per_update']} "
            f"tokens, {engine['parameters']} parameters):",
            "",
            "| loss | update [s] | peak allocated [GiB] |",
            "|---|---|---|",
            f"| TROLL | {engine['troll']['update_s']:.3f} | {engine['troll']['peak_gib']:.2f} |",
            f"| clip | {engine['clip']['update_s']:.3f} | {engine['clip']['peak_gib']:.2f} |",
            f"| TROLL / clip | {_num(engine['time_ratio'])} | {_num(engine['mem_ratio'])} |",
            "",
            f"Bound held on every token: {'yes' if engine['bound_held'] else 'NO'}.",
        ]
    return "\n".join(lines) + "\n"


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _detail(name: str, stage: dict) -> str:
    if "result" not in stage:
        return stage.get("error", "").strip().splitlines()[-1][:200] if stage.get("error", "").strip() else ""
    result = stage["result"]
    if name == "core":
        failed = ", ".join(result["failed_tests"][:5])
        return f"{result['passed']} passed, {result['failed']} failed, {result['skipped']} skipped" + (
            f" ({failed})" if failed else ""
        )
    if name == "bench_loss":
        return ", ".join(
            f"{c['dtype']} H={c['H']}: time {_num(c['time_ratio'])}, memory {_num(c['mem_ratio'])}"
            for c in result["cases"]
        )
    if name == "engine":
        return (
            f"time {_num(result['time_ratio'])}, memory {_num(result['mem_ratio'])}, "
            f"{100 * result['projected_frac']:.0f} % projected, bound held {result['bound_held']}"
        )
    return ""


# ----------------------------------------------------------------------------------------------------------- main
def run_stage(name: str, work_dir: str, log_path: str) -> dict:
    """``name`` in a child process (its own CUDA context and process group) under its time limit; its intermediate
    files go to ``work_dir``, its output is appended to ``log_path``."""
    start = time.perf_counter()
    result_path = os.path.join(work_dir, f"{name}.result.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--stage", name, "--work", work_dir]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=STAGE_LIMIT_S[name])
        log = proc.stdout + proc.stderr
        status = "ok" if proc.returncode == 0 and os.path.exists(result_path) else "failed"
    except subprocess.TimeoutExpired as exc:
        log, status = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {STAGE_LIMIT_S[name]} s", "timed out"
    log = log if isinstance(log, str) else log.decode(errors="replace")
    with open(log_path, "a") as f:
        f.write(f"\n===== {name} =====\n{log}")
        for extra in ("core_tests.log", "bench_loss.log"):  # the stage's own children
            if name in extra and os.path.exists(os.path.join(work_dir, extra)):
                f.write(f"\n----- {extra} -----\n" + open(os.path.join(work_dir, extra)).read())
    stage = {"status": status, "seconds": time.perf_counter() - start}
    if status == "ok":
        with open(result_path) as f:
            stage["result"] = json.load(f)
        if name == "core" and stage["result"]["failed"] + stage["result"]["errors"]:
            stage["status"] = "failed"
        if name == "engine" and not stage["result"]["bound_held"]:
            stage["status"] = "failed"
    else:
        stage["error"] = log[-3000:]
    print(f"[gpu_check] {name}: {stage['status']} in {stage['seconds']:.0f} s", flush=True)
    return stage


def build_parser() -> argparse.ArgumentParser:
    """The command line (the docs' commands for this script are parsed with it: tests/docs/test_docs_on_cpu.py)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/gpu_check", help="gpu_check.json, gpu_check.md, gpu_check.log")
    parser.add_argument("--work", default=None, help="intermediate files (default: a new temporary folder)")
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    parser.add_argument("--stage", choices=list(STAGES), help=argparse.SUPPRESS)  # internal: run one stage here
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="troll-gpu-check-")
    if args.stage:
        result = STAGES[args.stage](work)
        with open(os.path.join(work, f"{args.stage}.result.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
        return 0
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "gpu_check.log")
    open(log_path, "w").close()
    report = {"date": time.strftime("%Y-%m-%d %H:%M")}
    try:
        for name in args.stages:
            report[name] = run_stage(name, work, log_path)
    finally:
        if args.work is None:  # the temporary folder made above: its files are in the report and the log now
            shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    markdown = render_markdown(report)
    with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
        f.write(markdown)
    print(markdown)
    return 0 if all(report[name]["status"] == "ok" for name in args.stages) else 1


if __name__ == "__main__":
    sys.exit(main())
