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
"""benchmarks.study.summary: the README's headline and results table are what the committed raw results give."""

import json
import re
import shutil
from pathlib import Path

from benchmarks.study import docs_block, summary
from troll_verl.testing import REPO

RESULTS = Path(REPO) / "benchmarks" / "results"


def _readme_block(text: str) -> str:
    match = docs_block.study_block("summary").search(text)
    assert match, "README.md has no '<!-- report: ... --study summary ... -->' block"
    return match.group(2)


def test_the_readmes_results_are_what_the_committed_runs_give():
    """Every number of the README's headline and results table, recomputed from the committed raw files by each study's
    own plan code; a number typed in by hand, or a study's runs changed after the README was written, fails."""
    block = _readme_block((Path(REPO) / "README.md").read_text())
    printed = summary.report(str(RESULTS))
    assert block.strip() == printed.strip(), (
        "README.md's results are not what the committed runs give: run "
        ".venv/bin/python scripts/bench_learning.py --study summary --results-dir benchmarks/results --docs README.md"
    )
    # the block says what the issue asked of it: a two-sided headline, the late-decay row first, held-out with it
    assert printed.startswith("**At this scale TROLL did not learn better than clip.**")
    rows = [line for line in printed.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows[0].startswith("| late decay |") and "held-out accuracy at step 30" in rows[0]
    assert len(rows) == 5, rows


def test_a_changed_run_changes_the_readmes_numbers(tmp_path):
    """Planted: one late-decay TROLL run's train reward raised at steps 21-30 moves the headline and the late-decay row
    (so the README test above can fail); the powered study's rows do not move."""
    for study in (summary.POWERED_DIR, summary.LATE_DECAY_DIR):
        shutil.copytree(RESULTS / study, tmp_path / study)
    before = summary.report(str(tmp_path))
    path = tmp_path / summary.LATE_DECAY_DIR / "late8" / "troll" / "seed200.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if 21 <= row["step"] <= 30 and "critic/score/mean" in row["data"]:
            row["data"]["critic/score/mean"] += 0.5
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    after = summary.report(str(tmp_path))
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert {a[:14] for a, _ in changed} == {"**At this scal", "| late decay |"}, changed
    moved = float(re.search(r"\*\*(\S+) \[", changed[1][1]).group(1).replace("−", "-"))
    assert abs(moved - (-0.1370 + 0.5 / 24)) < 1e-3, moved  # one of 24 pairs, +0.5


def test_no_row_before_a_study_may_be_read(tmp_path):
    """A study whose plan allows no reading yet (the late-decay study before its interim look, a powered stage not
    complete) has no row and no headline: the summary shows only what the plans allow."""
    late = tmp_path / summary.LATE_DECAY_DIR / "late8"
    for loss in ("troll", "clip"):
        for seed in (200, 201):
            src = RESULTS / summary.LATE_DECAY_DIR / "late8" / loss / f"seed{seed}"
            (late / loss).mkdir(parents=True, exist_ok=True)
            for ext in (".json", ".jsonl"):
                shutil.copy(str(src) + ext, late / loss / f"seed{seed}{ext}")
    out = summary.report(str(tmp_path))
    assert "| late decay |" not in out and "powered" not in out and "At this scale" not in out
    assert out.startswith("| study |")
