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
"""The recipe's attention knob, ATTN_IMPLEMENTATION (recipe/troll/common.sh): the override it adds, the values and
scripts it refuses in bash, and a dry run of the command it records (Hydra and TROLL's start-up checks accept it)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipe" / "troll"
SMALL, FSDP_8B, MEGATRON_8B = (RECIPE / f"run_qwen3_{m}.sh" for m in ("0.6b_fsdp", "8b_fsdp", "8b_megatron"))
SDPA = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
# every knob of the recipe, and what else changes a run, removed from the inherited environment
_KNOBS = {m for p in RECIPE.glob("*.sh") for m in re.findall(r"^\s*([A-Z][A-Z0-9_]*)=\$\{\1:-", p.read_text(), re.M)}
_SCRUBBED = {*_KNOBS, "VERL_PLATFORM", "TROLL_DRY_RUN", "DRY_RUN_RECORD", "EXPERIMENT", "TRACE"}


def _record(script: Path, tmp_path: Path, **knobs: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``DRY_RUN=1 DRY_RUN_RECORD=...``: the script writes its command instead of running it (no Python starts)."""
    record = tmp_path / "cell.cmd"
    record.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env.update(DATA_DIR=str(tmp_path / "data"), DRY_RUN="1", DRY_RUN_RECORD=str(record), **knobs)
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    argv = [part.decode() for part in record.read_bytes().split(b"\0")[:-1]] if record.exists() else []
    return proc, argv


@pytest.mark.parametrize("script", [SMALL, FSDP_8B])
def test_the_knob_sets_the_actors_attention(script, tmp_path):
    proc, argv = _record(script, tmp_path, ATTN_IMPLEMENTATION="sdpa")
    assert proc.returncode == 0, proc.stderr
    assert argv.count(SDPA) == 1
    proc, argv = _record(script, tmp_path)
    assert proc.returncode == 0 and argv and not any("attn_implementation" in a for a in argv)  # verl's default


@pytest.mark.parametrize(
    "script, knobs, message",
    [
        (SMALL, {"ATTN_IMPLEMENTATION": "flash"}, "ATTN_IMPLEMENTATION=flash is not one of flash_attention_2|sdpa"),
        (MEGATRON_8B, {"ATTN_IMPLEMENTATION": "sdpa"}, "Megatron engine builds attention with Megatron-Core"),
        (FSDP_8B, {"ATTN_IMPLEMENTATION": "sdpa", "SP_SIZE": "2"}, "Ulysses sequence parallelism wraps flash"),
        (SMALL, {"ATTN_IMPLEMENTATION": "flash_attention_2", "CPU": "1"}, "CPU=1 runs with sdpa"),
    ],
)
def test_what_the_knob_refuses(script, knobs, message, tmp_path):
    proc, argv = _record(script, tmp_path, **knobs)
    assert proc.returncode == 2 and message in proc.stderr and argv == [], proc.stderr


def test_cpu_mode_keeps_its_own_sdpa_once(tmp_path):
    proc, argv = _record(SMALL, tmp_path, ATTN_IMPLEMENTATION="sdpa", CPU="1")
    assert proc.returncode == 0, proc.stderr
    assert argv.count(SDPA) == 1  # Hydra refuses a '+' key given twice


def test_the_recorded_command_passes_the_dry_run(tmp_path, monkeypatch, gpu_node_env):
    """The sdpa command composes, validates and passes TROLL's attention check with no flash-attn (none here); the
    default (flash_attention_2) command passes the dry run too, which reports flash-attn missing on this machine."""
    from troll_verl.integration import startup
    from troll_verl.tools.dry_run import dry_run_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(startup, "_importable", lambda package: False)
    seen = []
    real = startup.check_attention
    monkeypatch.setattr(startup, "check_attention", lambda config, **kw: seen.append(real(config, **kw)) or seen[-1])
    for knobs in ({"ATTN_IMPLEMENTATION": "sdpa"}, {}):
        proc, argv = _record(SMALL, tmp_path, VARIANT="grpo", **knobs)
        assert proc.returncode == 0, proc.stderr
        assert dry_run_command(argv[2:]) == 0
    assert len(seen) == 2 and seen[0] == [] and "neither flash_attn nor kernels" in seen[1][0]


def test_the_readme_documents_the_knob():
    readme = (RECIPE / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `ATTN_IMPLEMENTATION` |"))
    assert "`sdpa`" in row and "flash_attention_2" in row and "critic" in row and "Megatron" in row
