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
"""troll_verl.tools.trainer_process: a run that outlives its limit is stopped and says where it stood."""

import json
import textwrap

import psutil
import pytest

from troll_verl.tools.trainer_process import run_trainer

# A stand-in trainer: one metrics row, twenty log lines (the last one long, as verl's step lines are), then it hangs.
_HANGING_TRAINER = """
    import json, os, time
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "w") as f:
        f.write(json.dumps({"step": 1, "data": {"actor/loss": 0.5}}) + "\\n")
    for i in range(20):
        print(f"line {i}", flush=True)
    print("step:1 - " + "x" * 1000, flush=True)
    time.sleep(600)
"""


def test_a_hung_run_is_stopped_and_its_error_shows_the_end_of_its_log(tmp_path):
    (tmp_path / "hanging_trainer.py").write_text(textwrap.dedent(_HANGING_TRAINER))
    with pytest.raises(TimeoutError) as error:
        run_trainer([], str(tmp_path / "run"), module="hanging_trainer", timeout_s=4, env={"PYTHONPATH": str(tmp_path)})
    message = str(error.value)
    assert "after 4 s, 1 step(s) done" in message
    assert "line 19" in message and "line 9\n" in message and "line 8\n" not in message  # the last 12 lines
    assert "x" * 200 + " ..." in message and "x" * 300 not in message  # long lines cut
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["step"] == 1
    assert not [p for p in psutil.process_iter(["cmdline"]) if "hanging_trainer" in (p.info["cmdline"] or [])]
