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
"""Launches of whole runs in tests: a tag every process of a run inherits (so a test sees only its own leftovers, not
another Ray instance on the machine), and waiting for a condition."""

from __future__ import annotations

import time
import uuid

import psutil


class RunTag:
    """An environment variable with a fresh value: pass :attr:`env` to every launch, then ask what is left."""

    def __init__(self, var: str = "TROLL_TEST_RUN_TAG"):
        self.var, self.value = var, uuid.uuid4().hex
        self.env = {var: self.value}

    def processes(self, name_part: str = "") -> list[str]:
        """Command lines of live processes carrying the tag (and ``name_part`` in their command line)."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if proc.environ().get(self.var) == self.value:
                    cmdline = " ".join(proc.info["cmdline"] or ())
                    if name_part in cmdline:
                        found.append(cmdline[:160])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found


def wait_until(predicate, timeout_s: float, poll_s: float = 1.0) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` has passed; its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()
