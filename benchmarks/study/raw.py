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
"""The learning benchmark's raw results: each finished run's filtered per-step metrics and its record, read and
written atomically, and the record of every failed attempt."""

from __future__ import annotations

import json
import os
import subprocess
import time

from troll_verl.tools.metrics_io import read_jsonl
from troll_verl.tools.quickstart import REWARD_KEY

__all__ = [
    "LENGTH_KEY",
    "RAW_KEY_PREFIXES",
    "FAILED_ATTEMPTS",
    "raw_path",
    "save_raw",
    "load_raw",
    "record_failed_attempt",
    "versions",
]

LENGTH_KEY = "response_length/mean"
# Each finished run keeps its per-step metrics, filtered to these keys, as verl file-logger JSONL
# (``<results-dir>/<variant>/<loss>/seed<k>.jsonl``, a few kB) and its run record beside it (``seed<k>.json``: peak
# memory, wall time, overrides, versions). Committed, they regenerate every table and plot (``--report-only``).
RAW_KEY_PREFIXES = (
    REWARD_KEY,
    "val-core/",
    "actor/entropy",
    "actor/troll/",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/grad_norm",
    "actor/pg_loss",
    LENGTH_KEY,
    "response_length/clip_ratio",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/old_log_prob",
    "timing_s/update_actor",
    "training/off_policy/",
    "rollout_corr/kl",
    "training/rollout_probs_diff_max",
)


def raw_path(results_dir: str, key: str) -> str:
    """``<results_dir>/<variant>/<loss>/seed<k>.jsonl`` for the run ``<variant>/<loss>/seed<k>``."""
    return os.path.join(results_dir, *key.split("/")) + ".jsonl"


def save_raw(results_dir: str, key: str, rows: list[dict], record: dict) -> str:
    """Write a finished run's filtered metrics and its record; atomically, so a stop midway leaves no half file."""
    path = raw_path(results_dir, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path[: -len(".jsonl")] + ".json", "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for row in rows:
            data = {k: v for k, v in row.items() if k != "step" and k.startswith(RAW_KEY_PREFIXES)}
            f.write(json.dumps({"step": row["step"], "data": data}, sort_keys=True) + "\n")
    os.replace(tmp, path)  # the metrics last: their presence marks the run finished
    return path


def load_raw(results_dir: str, key: str) -> tuple[list[dict], dict]:
    """A run's committed ``(rows, record)``; ``([], {})`` when it has not finished."""
    path = raw_path(results_dir, key)
    if not os.path.exists(path):
        return [], {}
    record_path = path[: -len(".jsonl")] + ".json"
    record = json.load(open(record_path)) if os.path.exists(record_path) else {}
    return read_jsonl(path), record


FAILED_ATTEMPTS = "failed_attempts.jsonl"


def record_failed_attempt(results_dir: str, key: str, returncode: int, log_path: str, wall_s: float) -> str:
    """Append a failed run to ``<results_dir>/failed_attempts.jsonl`` (one JSON line: the run, its exit code, the
    last lines of its log, the code and whether the tree was clean), so the study records every attempt."""
    try:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-2000:]
    except OSError:
        tail = None
    entry = {
        "key": key,
        "returncode": returncode,
        "wall_s": round(wall_s, 1),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "log_tail": tail,
        **versions(),
    }
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, FAILED_ATTEMPTS)
    with open(path, "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    return path


def versions() -> dict:
    """The code and library versions a run record names."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("verl", "vllm", "torch"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out["commit"] = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        # whether the code that ran is exactly that commit (untracked files outside the package aside)
        status = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        out["tree_clean"] = status.strip() == ""
    except (OSError, subprocess.CalledProcessError):
        out["commit"] = None
        out["tree_clean"] = None
    return out
