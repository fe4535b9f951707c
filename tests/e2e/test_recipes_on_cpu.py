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
"""The TROLL recipe trains for real: ``CPU=1 bash recipe/troll/run_qwen3_0.6b_fsdp.sh`` (the recipe's CPU mode: the
same script and paper.yaml on troll-verl's CPU platform, SmolLM2-135M-Instruct for Qwen3), two steps per launch.

The data comes from ``tests/fixtures/data`` through the recipe's preprocessors (``examples/data_preprocess``). The
script takes the SmolLM2 asset from ``python -m troll_verl.assets.smollm2``, which finds it in the cache the suite built
it into once (``TROLL_VERL_CACHE``, the ``smollm2`` fixture of ``tests/e2e/conftest.py``). Two launches,
module-scoped fixtures returning finished runs:

- ``datasets``: ``VARIANT=gspo`` (TROLL with GSPO's sequence-level ratio) on all four datasets at once: one problem of
  each of GSM8K, DAPO-Math, Eurus-2 math and Eurus-2 code per batch (verl takes a list of train files; the recipe's
  reward dispatches on ``data_source``), the code scored in the local bubblewrap sandbox
  (``TROLL_CODE_SANDBOX=require``), and a validation pass at the end over the four validation sets (AIME-2024 for
  DAPO-Math). It runs in bypass mode (the old distribution from vLLM's top-64) on verl's legacy trainer
  (``trainer.use_v1=false``: the top-K reaches TROLL's training worker as the agent loop's columns; the v1 trainers'
  bypass step runs in tests/e2e/test_tiny_runs_on_cpu.py, with two epochs). The
  mismatch between the rollout and the actor is measured on each step's first micro-batch, before any update, where
  fp32 leaves rounding only;
- ``ppo``: ``VARIANT=ppo`` on GSM8K, on the v1 trainer: GAE with a critic initialised from the policy.

Both run at a tight bound with a larger learning rate than the paper's, so that the second mini-batch of a step leaves
the trust region and gets projected. Mini-batches whose groups all scored alike have zero GRPO advantages, and
SmolLM2 rarely solves these problems, so the GSPO launch adds a small entropy bonus: the policy moves in any case.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from troll_verl.recipes.rewards import Reason, compute_score
from troll_verl.testing import REPO
from troll_verl.testing.runs import RunTag, wait_until
from troll_verl.tools.lifetime import Watchdog, new_run_tag, run_env
from troll_verl.tools.quickstart import REWARD_KEY, cleanup_run, read_metrics

# a launch's limit: about 3x what one costs beside the other pytest worker (349-364 s measured, 2026-12-01)
RUN_TIMEOUT_S = 1200
TIGHT = 0.002
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)]

TAG = RunTag("TROLL_RECIPES_RUN_TAG")
SCRIPT = os.path.join(REPO, "recipe", "troll", "run_qwen3_0.6b_fsdp.sh")
FIXTURES = os.path.join(REPO, "tests", "fixtures", "data")
# dataset -> (preprocessor and its arguments, data_source of the train split, of the validation split)
DATASETS = {
    "gsm8k": (
        ["gsm8k.py", "--train-file", "gsm8k/train.jsonl", "--val-file", "gsm8k/test.jsonl"],
        "openai/gsm8k",
        "openai/gsm8k",
    ),
    "dapo_math": (
        ["dapo_math.py", "--train-file", "dapo_math/train.jsonl", "--val-file", "dapo_math/aime2024.jsonl"],
        "math_dapo",
        "aime2024",
    ),
    "eurus_math": (
        [
            "eurus2.py",
            "--subset",
            "math",
            "--train-file",
            "eurus2/train.jsonl",
            "--val-file",
            "eurus2/validation.jsonl",
        ],
        "eurus2_math",
        "eurus2_math",
    ),
    "eurus_code": (
        [
            "eurus2.py",
            "--subset",
            "code",
            "--train-file",
            "eurus2/train.jsonl",
            "--val-file",
            "eurus2/validation.jsonl",
        ],
        "eurus2_code",
        "eurus2_code",
    ),
}
BATCH, N = 4, 4  # the CPU mode's prompts per batch and rollouts per prompt
# the recipe's knobs and what else would change a launch: removed from the inherited environment
SCRUBBED = {
    "VARIANT",
    "DATASET",
    "LOSS_MODE",
    "GSPO_CLIP",
    "DATA_DIR",
    "MAX_PROMPT_LENGTH",
    "MAX_RESPONSE_LENGTH",
    "SANDBOX_FUSION_URL",
    "CRITIC_LR",
    "EXPERIMENT",
    "DRY_RUN",
    "DRY_RUN_RECORD",
    "PYTHON",
    "CPU",
    "MODEL_PATH",
    "VERL_PLATFORM",
    "TROLL_DRY_RUN",
    "TRACE",
    "NNODES",
    "NGPUS",
    "PPO_MAX_TOKEN_LEN_PER_GPU",
    "ROLLOUT_TP",
    "ROLLOUT_GPU_MEM_UTIL",
    "OFFLOAD",
    "THINKING",
    "TROLL_CODE_SANDBOX",
}


class Run:
    """A finished launch: exit status, log, metrics rows of the training steps, the composed config, its folder."""

    def __init__(self, run_dir: str, returncode: int, wall_s: float):
        self.dir, self.returncode, self.wall_s = run_dir, returncode, wall_s
        self.log = open(os.path.join(run_dir, "trainer.log")).read()
        all_rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
        self.rows = [r for r in all_rows if REWARD_KEY in r]
        self.val = {k: v for r in all_rows for k, v in r.items() if k.startswith("val-")}
        saved = os.path.join(run_dir, "hydra", ".hydra", "config.yaml")
        self.config = OmegaConf.load(saved) if os.path.exists(saved) else None

    def check(self) -> Run:
        assert self.returncode == 0, self.log[-6000:]
        assert [r["step"] for r in self.rows] == [1, 2], self.log[-3000:]
        return self

    def dumped(self, step: int) -> list[dict]:
        with open(os.path.join(self.dir, "rollouts", f"{step}.jsonl")) as f:
            return [json.loads(line) for line in f]


@pytest.fixture(scope="module", autouse=True)
def nothing_left_at_the_end():
    yield
    assert wait_until(lambda: not TAG.processes(), 60), TAG.processes()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """DATA_DIR: every dataset's fixture through its preprocessor, as the recipe README's commands write it."""
    data_dir = str(tmp_path_factory.mktemp("data"))
    for dataset, (args, _, _) in DATASETS.items():
        script, *rest = args
        rest = [os.path.join(FIXTURES, a) if a.endswith(".jsonl") else a for a in rest]
        proc = subprocess.run(
            [
                sys.executable,
                os.path.join(REPO, "examples", "data_preprocess", script),
                *rest,
                "--local-dir",
                os.path.join(data_dir, dataset),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return data_dir


@pytest.fixture(scope="module")
def one_each(data, tmp_path_factory) -> dict[str, str]:
    """The first training problem of each dataset, one file each: a batch of 4 holds all four datasets."""
    out = tmp_path_factory.mktemp("one_each")
    files = {}
    for dataset in DATASETS:
        files[dataset] = str(out / f"{dataset}.parquet")
        pq.write_table(pq.read_table(os.path.join(data, dataset, "train.parquet")).slice(0, 1), files[dataset])
    return files


@pytest.fixture(scope="module")
def cache(smollm2) -> str:
    """TROLL_VERL_CACHE: the cache holding the test run's SmolLM2 build, where the script's build step finds it."""
    return os.path.dirname(smollm2.root)


def _launch(run_dir: str, cache: str, data_dir: str, knobs: dict[str, str], *overrides: str) -> Run:
    """``CPU=1 <knobs> bash run_qwen3_0.6b_fsdp.sh <overrides>`` with a private Ray, its metrics in a file, and every
    process of the run stopped at the end however it ends (as :func:`troll_verl.tools.quickstart.run_trainer`)."""
    ray_temp_dir = tempfile.mkdtemp(prefix="trollray-", dir="/tmp")  # Ray's socket paths must stay short
    tag = new_run_tag()
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env.update(
        CPU="1",
        PYTHON=sys.executable,
        DATA_DIR=data_dir,
        TROLL_VERL_CACHE=cache,
        VERL_FILE_LOGGER_PATH=os.path.join(run_dir, "metrics.jsonl"),
        TOKENIZERS_PARALLELISM="false",
        HYDRA_FULL_ERROR="1",
        RAY_DEDUP_LOGS="0",
        TROLL_CODE_SANDBOX="require",
        **knobs,
        **TAG.env,
        **run_env(tag),
    )
    cmd = [
        "bash",
        SCRIPT,
        "trainer.total_training_steps=2",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        f"actor_rollout_ref.actor.policy_loss.kl_bound={TIGHT}",
        f"trainer.rollout_data_dir={run_dir}/rollouts",
        # a batch holds at most 16 x 384 tokens (6k, 280 MB of SmolLM2's KV cache): 384 MiB instead of 1 GiB
        "++actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=402653184",
        *overrides,
        f"++ray_kwargs.ray_init._temp_dir={ray_temp_dir}",
        f"hydra.run.dir={os.path.join(run_dir, 'hydra')}",
    ]
    proc = None
    start = time.perf_counter()
    watchdog = Watchdog(tag).start()  # stops the run's processes even if pytest is killed
    try:
        with open(os.path.join(run_dir, "trainer.log"), "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            # cwd: verl's file logger and Hydra write nothing outside run_dir, but keep anything else there too
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=run_dir, start_new_session=True
            )
            proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass  # the return code stays None: Run.check fails with the log's tail
    finally:
        cleanup_run(proc, tag)
        watchdog.close()
        shutil.rmtree(ray_temp_dir, ignore_errors=True)
    return Run(run_dir, proc.returncode if proc is not None else None, time.perf_counter() - start)


@pytest.fixture(scope="module")
def datasets(data, one_each, cache, tmp_path_factory) -> Run:
    run_dir = str(tmp_path_factory.mktemp("datasets"))
    train = ",".join(f"'{one_each[d]}'" for d in DATASETS)
    val = ",".join(f"'{os.path.join(data, d, 'val.parquet')}'" for d in DATASETS)
    return _launch(
        run_dir,
        cache,
        data,
        dict(VARIANT="gspo", DATASET="gsm8k", EXPERIMENT="recipe-cpu-datasets-gspo"),
        f"data.train_files=[{train}]",
        f"data.val_files=[{val}]",
        "trainer.val_before_train=False",
        "trainer.test_freq=2",
        "actor_rollout_ref.actor.entropy_coeff=1e-3",
        "algorithm.rollout_correction.bypass_mode=true",
        "trainer.use_v1=false",
    )


@pytest.fixture(scope="module")
def ppo(data, cache, tmp_path_factory) -> Run:
    run_dir = str(tmp_path_factory.mktemp("ppo"))
    return _launch(
        run_dir,
        cache,
        data,
        dict(VARIANT="ppo", DATASET="gsm8k", MAX_RESPONSE_LENGTH="32", EXPERIMENT="recipe-cpu-gsm8k-ppo"),
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
    )


def _data_sources(data: str, split: str) -> dict[str, str]:
    """ground truth -> data_source over every dataset's preprocessed ``split`` (the fixtures' answers are distinct)."""
    found = {}
    for dataset in DATASETS:
        for row in pq.read_table(os.path.join(data, dataset, f"{split}.parquet")).to_pylist():
            truth = row["reward_model"]["ground_truth"]
            assert found.setdefault(truth, row["data_source"]) == row["data_source"], truth
    return found


def _rescored(run: Run, data: str) -> dict[str, list[dict]]:
    """Every dumped training response, scored again here by the recipe's reward; by data_source. The score the run
    gave it must be this one."""
    sources = _data_sources(data, "train")
    by_source: dict[str, list[dict]] = {}
    for row in run.rows:
        samples = run.dumped(row["step"])
        assert len(samples) == BATCH * N
        for sample in samples:
            source = sources[sample["gts"]]
            result = compute_score(source, sample["output"], sample["gts"])
            assert sample["score"] == result["score"], (source, sample, result)
            by_source.setdefault(source, []).append(result)
        assert row[REWARD_KEY] == pytest.approx(sum(s["score"] for s in samples) / len(samples))
    return by_source


def _assert_troll_projected_and_kept_the_bound(run: Run):
    rows = run.rows
    assert run.config.actor_rollout_ref.actor.policy_loss.loss_mode == "troll"
    assert max(r["actor/troll/projected_frac"] for r in rows) > 0.0, [r["actor/troll/projected_frac"] for r in rows]
    for r in rows:
        assert r["actor/troll/kl_after_max"] <= TIGHT * (1 + 1e-3), r["actor/troll/kl_after_max"]
        assert r["actor/troll/bound_violation_max"] <= TIGHT * 1e-3, r["actor/troll/bound_violation_max"]


def _assert_cpu_mode_and_paper_config(run: Run, cache: str):
    """The launch is the recipe's: paper.yaml's settings, the CPU mode's batch and platform, SmolLM2 from the cache."""
    cfg = run.config
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.actor_rollout_ref.model.path.startswith(cache) and "smollm2" in cfg.actor_rollout_ref.model.path
    assert (cfg.data.train_batch_size, rollout.n, actor.ppo_mini_batch_size) == (BATCH, N, 2)
    assert (actor.use_dynamic_bsz, actor.clip_ratio_c, rollout.temperature) == (True, 10.0, 1.0)
    assert cfg.reward.custom_reward_function.path == "pkg://troll_verl.recipes.rewards"
    assert (actor.strategy, rollout.name, rollout.dtype) == ("fsdp2", "vllm", "float32")


# ------------------------------------------------------------------------------------------- four datasets, GSPO
def test_gspo_on_four_datasets_projects_and_keeps_the_bound(datasets, cache):
    datasets.check()
    _assert_cpu_mode_and_paper_config(datasets, cache)
    cfg = datasets.config
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.norm_adv_by_std_in_grpo
    assert cfg.actor_rollout_ref.actor.policy_loss.ratio_level == "sequence"
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-mean"
    assert len(cfg.data.train_files) == 4
    _assert_troll_projected_and_kept_the_bound(datasets)


def test_bypass_mode_on_the_legacy_trainer_projects_around_the_rollout_policy(datasets):
    """On the legacy trainer: no old-log-prob pass (verl writes ``actor/entropy`` right after it, and it is absent),
    and TROLL's worker neither recomputed nor reused one: the old distribution is vLLM's top-64, from the agent loop's
    columns; before each step's first update the actor and the rollout differ by fp32 numerics alone, so the mismatch
    stays far below the bound.

    Rounding is not always invisible: where it swaps the tokens at the rollout's and the actor's rank K, the one only
    the actor ranks inside gets the paper's floor as its old value (TROLL §5) and hundredths of KL, which projects it
    (tests/bypass/test_rollout_topk_on_cpu.py). Measured on the first micro-batch (about 510 tokens): 2e-7 to 4e-7
    with no swap, 7.0e-5 with one token projected (CI, stop 62, step 2). The thresholds allow several swaps; a bf16
    rollout gives 0.014-0.023 (docs/bypass.md), a rollout whose refit dropped step 1's update 0.082 at step 2 with 91 %
    of the tokens projected (planted once, 2026-12-02)."""
    rows = datasets.check().rows
    assert "TROLL bypass mode: no old-log-prob pass" in datasets.log
    # verl's legacy task runner (main_ppo_v0.TaskRunner; the v1 trainers' is TaskRunnerV1), as Ray prefixes its lines
    assert datasets.config.trainer.use_v1 is False and "(TaskRunner pid=" in datasets.log
    for r in rows:
        assert "actor/entropy" not in r
        assert r["actor/troll/old_from_rollout"] == 1.0 and r["actor/troll/old_pass_recompute_s"] == 0.0
        assert abs(r["actor/troll/mismatch_kl"]) < TIGHT / 4, r["actor/troll/mismatch_kl"]
        assert r["actor/troll/mismatch_projected_frac"] < 0.02, r["actor/troll/mismatch_projected_frac"]
        assert 0.0 < r["actor/troll/rollout_tail_mass"] < 1.0


def test_every_datasets_reward_scored_its_responses(datasets, data):
    by_source = _rescored(datasets.check(), data)
    # one problem of each dataset in every batch of 4: N responses per dataset and step
    assert {source: len(results) for source, results in by_source.items()} == {
        source: 2 * N for _, source, _ in DATASETS.values()
    }


def test_code_ran_in_the_sandbox(datasets, data):
    """At least one code response had a closed code block, so the program ran on the tests (in bubblewrap: the launch
    sets TROLL_CODE_SANDBOX=require, which fails the reward instead of running code without it). SmolLM2 closes a
    block within 128 tokens in about half of its samples: 8 samples all without one is ~0.4 % likely."""
    code = _rescored(datasets.check(), data)["eurus2_code"]
    ran = [r for r in code if r["reason"] != Reason.NO_ANSWER]
    assert ran, code
    assert all(r["has_answer"] == 1.0 for r in ran)


def test_validation_scored_every_datasets_validation_set(datasets):
    datasets.check()
    for _, _, source in DATASETS.values():
        assert f"val-core/{source}/acc/mean@1" in datasets.val, sorted(datasets.val)
        assert f"val-aux/{source}/has_answer/mean@1" in datasets.val, sorted(datasets.val)


# ------------------------------------------------------------------------------------------- PPO with a critic
def test_ppo_with_a_critic_trains_with_troll(ppo, cache, data):
    ppo.check()
    _assert_cpu_mode_and_paper_config(ppo, cache)
    cfg = ppo.config
    assert cfg.algorithm.adv_estimator == "gae" and cfg.critic.strategy == "fsdp2" and cfg.trainer.use_v1
    assert cfg.critic.model.path == cfg.actor_rollout_ref.model.path
    assert cfg.actor_rollout_ref.actor.policy_loss.ratio_level == "token"
    _assert_troll_projected_and_kept_the_bound(ppo)
    assert set(_rescored(ppo, data)) == {"openai/gsm8k"}


def test_ppo_critic_value_loss_is_logged_and_changes(ppo):
    rows = ppo.check().rows
    losses = [r["critic/vf_loss"] for r in rows]
    assert all(math.isfinite(v) for v in losses) and losses[0] != losses[1], losses
    for r in rows:
        assert math.isfinite(r["critic/values/mean"]) and math.isfinite(r["critic/vpred_mean"])
        # GAE's advantages come from the critic's values: non-zero although the rewards may all be alike
        assert r["critic/advantages/max"] > r["critic/advantages/min"]
