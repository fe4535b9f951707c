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
"""The studies' tables in the docs: the blocks between ``<!-- report: <a --study command> -->`` and
``<!-- end report -->`` that a ``--study`` command rewrites."""

from __future__ import annotations

import os
import re

__all__ = ["STUDIES", "study_block", "write_study_docs"]

# the studies --study reports: the powered study (--study alone), the late-decay study's stage 1, the README's
# results (benchmarks.study.summary) and the after-mastery probes (benchmarks.study.after_mastery)
STUDIES = ("powered", "late_decay", "summary", "after_mastery")


def study_block(study: str) -> re.Pattern:
    """The docs block of ``study``'s tables: ``<!-- report: <its --study command> -->`` ... ``<!-- end report -->``
    (the powered study's command is ``--study`` followed by another option or nothing)."""
    flag = r"--study(?= --| -->)" if study == "powered" else rf"--study {study}\b"
    return re.compile(rf"(<!-- report: [^\n]*{flag}[^\n]* -->\n)(.*?)(<!-- end report -->)", flags=re.S)


def write_study_docs(path: str, report: str, study: str = "powered") -> int:
    """Rewrite, in the Markdown file ``path``, every block between ``<!-- report: <study's --study command> -->`` and
    ``<!-- end report -->`` with ``report`` (what that command prints); returns the number of blocks rewritten.
    tests/scripts/test_benchmarks_on_cpu.py checks that the committed blocks are what the command prints today."""
    with open(path) as f:
        text = f.read()
    new, count = study_block(study).subn(lambda m: m.group(1) + "\n" + report + "\n" + m.group(3), text)
    command = "--study" if study == "powered" else f"--study {study}"
    if count == 0:
        raise SystemExit(
            f"--docs {path}: no '<!-- report: ... {command} ... -->' ... '<!-- end report -->' block; "
            f"add one whose marker names the {command} command, where the tables belong"
        )
    if new != text:
        with open(path + ".tmp", "w") as f:
            f.write(new)
        os.replace(path + ".tmp", path)
    return count
