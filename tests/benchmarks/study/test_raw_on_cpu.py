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
"""benchmarks.study.raw: failed attempts recorded with their log and code."""

import json

from benchmarks.study import raw


def test_a_failed_run_is_recorded_with_its_log_and_code(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("x" * 5000 + "\nRuntimeError: the planted failure\n")
    path = raw.record_failed_attempt(str(tmp_path / "results"), "late8/clip/seed200", 1, str(log), 12.34)
    raw.record_failed_attempt(str(tmp_path / "results"), "late8/troll/seed201", -9, str(tmp_path / "gone.log"), 1.0)
    lines = [json.loads(line) for line in open(path)]
    assert [(e["key"], e["returncode"]) for e in lines] == [("late8/clip/seed200", 1), ("late8/troll/seed201", -9)]
    assert lines[0]["log_tail"].endswith("the planted failure\n") and len(lines[0]["log_tail"]) == 2000
    assert lines[1]["log_tail"] is None
    assert lines[0]["wall_s"] == 12.3
    assert len(lines[0]["commit"]) == 40 and isinstance(lines[0]["tree_clean"], bool)
