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
"""troll_verl.testing.schedule: with ``pytest -n 2`` a test folder runs in one worker, the end-to-end folder first and
the upstream folder second, beside it, and each worker's processes on its share of the cores; scripts/test.sh runs
the suite that way."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from troll_verl.testing import schedule
from troll_verl.testing.schedule import FIRST, THREADS_ENV, WORKER_ENV, folder_of, machine_cores, threads_per_worker

ROOT = pathlib.Path(__file__).resolve().parents[2]

# each test writes which worker ran it, when it started and ended, and the thread count a subprocess of it inherits;
# the end-to-end tests take longest
_TEST = """
    import json, os, subprocess, sys, time

    def _record(name, seconds):
        start = time.time()
        time.sleep(seconds)
        threads = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OMP_NUM_THREADS'))"],
                                 capture_output=True, text=True).stdout.strip()
        with open(os.environ["RECORD"], "a") as f:
            f.write(json.dumps([name, os.environ.get("PYTEST_XDIST_WORKER"), start, time.time(), threads]) + "\\n")

"""
_FOLDERS = {"aaa": 6, "e2e": 3, "kernels": 2, "upstream": 2}  # folder: its tests ("aaa" sorts and counts first)
_SECONDS = {"e2e": 1.5, "upstream": 1.0}  # the rest 0.2 s each
_FIRST = [folder.removeprefix("tests/") for folder in FIRST]


def _suite(tmp_path: pathlib.Path) -> pathlib.Path:
    for folder, count in _FOLDERS.items():
        d = tmp_path / "tests" / folder
        d.mkdir(parents=True)
        body = textwrap.dedent(_TEST) + "".join(
            f"def test_{i}():\n    _record('{folder}', {_SECONDS.get(folder, 0.2)})\n\n" for i in range(count)
        )
        (d / f"test_{folder}.py").write_text(body)
    return tmp_path


def _run(tmp_path: pathlib.Path, *plugin: str, threads: str | None = None) -> list[tuple[str, str, float, float, str]]:
    """The suite on two workers (``threads``: the caller's OMP_NUM_THREADS, else none): (folder, worker, start, end,
    a subprocess's OMP_NUM_THREADS) of each test."""
    suite, record = _suite(tmp_path), tmp_path / "record.jsonl"
    env = {**os.environ, "RECORD": str(record)}
    env.pop(WORKER_ENV, None)
    env.pop(THREADS_ENV, None)
    if threads is not None:
        env[THREADS_ENV] = threads
    cmd = [sys.executable, "-m", "pytest", "-n", "2", *plugin, "-p", "no:cacheprovider", "-q",
           "-c", os.devnull, "--rootdir", str(suite), "tests"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=suite, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return [tuple(json.loads(line)) for line in record.read_text().splitlines()]


@pytest.mark.slow
def test_a_folder_is_one_unit_the_end_to_end_folder_first_the_upstream_one_beside_it(tmp_path):
    runs = _run(tmp_path, "-p", "troll_verl.testing.schedule")
    assert len(runs) == sum(_FOLDERS.values())
    workers = {folder: {w for f, w, *_ in runs if f == folder} for folder in _FOLDERS}
    assert all(len(w) == 1 for w in workers.values()), workers  # each folder in one worker
    # every test's subprocesses compute on the worker's share of the cores
    assert {r[4] for r in runs} == {str(threads_per_worker(2, machine_cores()))}, runs
    first = {}
    for folder, worker, *_ in sorted(runs, key=lambda r: r[2]):
        first.setdefault(worker, folder)
    assert sorted(first.values()) == sorted(_FIRST), first  # each worker started with one of them
    (e2e_worker,) = workers["e2e"]
    e2e_start = min(r[2] for r in runs if r[0] == "e2e")
    e2e_end = max(r[3] for r in runs if r[0] == "e2e")
    # the other folders ran in the other worker while the end-to-end folder ran
    beside = {f for f, w, s, *_ in runs if w != e2e_worker and e2e_start < s < e2e_end}
    assert {"upstream", "aaa"} <= beside, runs


@pytest.mark.slow
def test_without_the_plugin_a_folder_is_split(tmp_path):
    """The same suite under pytest-xdist's own ``--dist load``: one folder's tests spread over both workers (what the
    test above checks against)."""
    runs = _run(tmp_path)
    workers = {folder: {w for f, w, *_ in runs if f == folder} for folder in _FOLDERS}
    assert any(len(w) == 2 for w in workers.values()), workers
    assert {r[4] for r in runs} == {"None"}  # and the thread count is left alone


@pytest.mark.slow
def test_a_thread_count_the_caller_set_is_kept(tmp_path):
    runs = _run(tmp_path, "-p", "troll_verl.testing.schedule", threads="3")
    assert {r[4] for r in runs} == {"3"}


@pytest.mark.parametrize("workers, cores, threads", [(2, 2, 1), (2, 16, 8), (3, 2, 1), (0, 4, 4), (1, 1, 1)])
def test_each_worker_gets_its_share_of_the_cores(workers, cores, threads):
    assert threads_per_worker(workers, cores) == threads


@pytest.mark.parametrize(
    "nodeid, folder",
    [
        ("tests/e2e/test_tiny_runs_on_cpu.py::test_sigkill_leaves_no_process", "tests/e2e"),
        ("tests/core/test_sparse_on_cpu.py::test_gradcheck_logits_path[sync-free-3]", "tests/core"),
        ("tests/test_imports_on_cpu.py::test_every_module_imports_in_a_fresh_interpreter", "tests"),
        ("test_top.py::test_x", "."),
    ],
)
def test_a_tests_unit_is_its_files_folder(nodeid, folder):
    assert folder_of(nodeid) == folder


def test_the_suite_runs_on_two_workers_with_this_plugin(request):
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert 'WORKERS="${TROLL_TEST_WORKERS:-2}"' in script and '-n "$WORKERS"' in script
    assert request.config.pluginmanager.has_plugin("troll_verl.testing.schedule")


def test_in_a_worker_the_hook_sets_the_share_and_resizes_torchs_pool(monkeypatch):
    """torch imported before the hook (a plugin or conftest did) gets its pool resized to the share."""
    import torch

    monkeypatch.setenv(WORKER_ENV, "gw0")
    monkeypatch.setenv(schedule.WORKER_COUNT_ENV, "2")
    monkeypatch.delenv(THREADS_ENV, raising=False)
    share = threads_per_worker(2, machine_cores())
    before = torch.get_num_threads()
    torch.set_num_threads(share + 1)
    try:
        schedule.pytest_configure(None)
        assert os.environ[THREADS_ENV] == str(share) and torch.get_num_threads() == share
    finally:
        torch.set_num_threads(before)


def test_outside_a_worker_the_hook_does_nothing(monkeypatch):
    monkeypatch.delenv(WORKER_ENV, raising=False)
    monkeypatch.delenv(THREADS_ENV, raising=False)
    schedule.pytest_configure(None)
    assert THREADS_ENV not in os.environ
