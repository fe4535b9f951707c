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
"""Data preparation: the schema check, the prompt formats, the dataset mappers and the ``examples/data_preprocess``
CLIs, run on the fixtures in ``tests/fixtures/data`` (no download)."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from troll_verl.recipes.data import check_rl_parquet, check_rl_rows
from troll_verl.recipes.data.common import RecordError, SplitReport, map_records, read_records
from troll_verl.recipes.data.dapo_math import build_dapo_split, dapo_row
from troll_verl.recipes.data.eurus2 import build_eurus2_split, eurus2_row, normalize_code_tests
from troll_verl.recipes.data.gsm8k import gsm8k_ground_truth, gsm8k_row
from troll_verl.recipes.data.prompts import (
    CODE_CALL_INSTRUCTION,
    CODE_STDIN_INSTRUCTION,
    GSM8K_INSTRUCTION,
    MATH_INSTRUCTION,
    code_prompt,
    dapo_problem,
    eurus2_code_problem,
    eurus2_math_problem,
    gsm8k_prompt,
    math_prompt,
)

REPO = str(Path(__file__).resolve().parents[2])
FIXTURES = os.path.join(REPO, "tests", "fixtures", "data")
SCRIPTS = os.path.join(REPO, "examples", "data_preprocess")

GSM8K_SUFFIX = '\nLet\'s think step by step and output the final answer after "####".'
MATH_SUFFIX = "\nLet's think step by step and output the final answer within \\boxed{}."


def fixture(*parts: str) -> str:
    return os.path.join(FIXTURES, *parts)


def run_cli(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def run_ok(script: str, *args: str) -> str:
    result = run_cli(script, *args)
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def read_rows(path: str) -> list[dict]:
    return pq.read_table(path).to_pylist()


def written(out_dir: str) -> dict[str, list[dict]]:
    """The two files a CLI wrote, schema-checked, and nothing else in the directory."""
    assert sorted(os.listdir(out_dir)) == ["train.parquet", "val.parquet"]
    rows = {split: read_rows(os.path.join(out_dir, f"{split}.parquet")) for split in ("train", "val")}
    for split, split_rows in rows.items():
        assert check_rl_parquet(os.path.join(out_dir, f"{split}.parquet")) == len(split_rows)
        assert [row["extra_info"]["index"] for row in split_rows] == list(range(len(split_rows)))
        assert {row["extra_info"]["split"] for row in split_rows} == {split}
        assert all(row["reward_model"]["style"] == "rule" for row in split_rows)
        assert all(len(row["prompt"]) == 1 and row["prompt"][0]["role"] == "user" for row in split_rows)
    return rows


def content(row: dict) -> str:
    return row["prompt"][0]["content"]


def load_cli(script: str):
    spec = importlib.util.spec_from_file_location(f"_cli_{script[:-3]}", os.path.join(SCRIPTS, script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------------------------------------
# CLIs on the fixtures
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gsm8k_out(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("gsm8k") / "out")
    stdout = run_ok(
        "gsm8k.py",
        "--train-file",
        fixture("gsm8k", "train.jsonl"),
        "--val-file",
        fixture("gsm8k", "test.jsonl"),
        "--local-dir",
        out,
    )
    return stdout, written(out)


def test_gsm8k_cli(gsm8k_out):
    stdout, rows = gsm8k_out
    assert [row["reward_model"]["ground_truth"] for row in rows["train"]] == ["26", "2400", "7", "1.25"]
    assert [row["reward_model"]["ground_truth"] for row in rows["val"]] == ["7", "385", "-5"]
    for row in rows["train"] + rows["val"]:
        assert row["data_source"] == "openai/gsm8k"
        assert row["ability"] == "math"
        assert content(row) == row["extra_info"]["question"] + GSM8K_SUFFIX
    assert content(rows["train"][2]) == (
        "Tom reads 15 pages a day. How many days does he need to read a 105-page book?" + GSM8K_SUFFIX
    )
    assert "train: read 4 records, kept 4 rows" in stdout
    assert "val: read 3 records, kept 3 rows" in stdout
    assert "schema check passed" in stdout


@pytest.fixture(scope="module")
def dapo_out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dapo")
    # AIME-2024 ships as parquet on the hub: feed it as parquet to exercise that reader too.
    aime_parquet = str(tmp / "aime-2024.parquet")
    pq.write_table(pa.Table.from_pylist(read_records(fixture("dapo_math", "aime2024.jsonl"))), aime_parquet)
    out = str(tmp / "out")
    stdout = run_ok(
        "dapo_math.py",
        "--train-file",
        fixture("dapo_math", "train.jsonl"),
        "--val-file",
        aime_parquet,
        "--local-dir",
        out,
    )
    return stdout, written(out), aime_parquet


def test_dapo_cli_dedups_and_reprompts(dapo_out):
    stdout, rows, _ = dapo_out
    train, val = rows["train"], rows["val"]
    assert [row["data_source"] for row in train] == ["math_dapo"] * 3
    assert [row["data_source"] for row in val] == ["aime2024"] * 2
    assert [row["reward_model"]["ground_truth"] for row in train] == ["66", "58", "19"]
    assert [row["reward_model"]["ground_truth"] for row in val] == ["299", "67"]
    assert content(train[1]) == (
        "Let $x$ and $y$ be real numbers with $x + y = 10$ and $xy = 21$. Compute $x^2 + y^2$." + MATH_SUFFIX
    )
    for row in train + val:
        assert row["ability"] == "math"
        assert content(row) == row["extra_info"]["problem"] + MATH_SUFFIX
        assert "Answer:" not in content(row) and "Solve the following" not in content(row)
    assert train[0]["extra_info"]["source_index"] == "0c2f6a3e-8d1b-4f5a-9e7c-1a2b3c4d5e01"
    assert val[1]["extra_info"]["source_index"] == "1"
    assert "train: read 6 records, kept 3 rows, removed 3 duplicate problems" in stdout
    assert "val: read 4 records, kept 2 rows, removed 2 duplicate problems" in stdout


def test_dapo_cli_no_dedup_and_max_samples(dapo_out, tmp_path):
    _, _, aime_parquet = dapo_out
    out = str(tmp_path / "out")
    args = ["--train-file", fixture("dapo_math", "train.jsonl"), "--val-file", aime_parquet, "--local-dir", out]
    run_ok("dapo_math.py", *args, "--no-dedup", "--max-samples", "5")
    rows = written(out)
    assert [row["reward_model"]["ground_truth"] for row in rows["train"]] == ["66", "58", "66", "19", "58"]
    assert len(rows["val"]) == 4


@pytest.fixture(scope="module")
def eurus2_code_out(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("eurus2_code") / "out")
    stdout = run_ok(
        "eurus2.py",
        "--subset",
        "code",
        "--train-file",
        fixture("eurus2", "train.jsonl"),
        "--val-file",
        fixture("eurus2", "validation.jsonl"),
        "--local-dir",
        out,
    )
    return stdout, written(out)


def test_eurus2_code_cli(eurus2_code_out):
    stdout, rows = eurus2_code_out
    train, val = rows["train"], rows["val"]
    assert [row["data_source"] for row in train + val] == ["eurus2_code"] * 3
    assert [row["ability"] for row in train + val] == ["code"] * 3
    assert [row["extra_info"]["source"] for row in train + val] == ["taco", "apps", "codeforces"]
    assert [row["extra_info"]["source_index"] for row in train + val] == ["1", "3", "1"]

    stdin_tests, call_tests = (json.loads(row["reward_model"]["ground_truth"]) for row in train)
    assert stdin_tests == {"inputs": ["3\n1 2 3\n", "2\n-5 5\n"], "outputs": ["6\n", "0\n"]}
    assert call_tests == {
        "inputs": ['"hello"', '"sky"', '"queue"'],
        "outputs": ["[2]", "[0]", "[4]"],
        "fn_name": "count_vowels",
    }
    # the first validation case came as a list of lines
    assert json.loads(val[0]["reward_model"]["ground_truth"]) == {
        "inputs": ["3\n4 9 2", "1\n-3\n"],
        "outputs": ["9", "-3\n"],
    }

    assert content(train[0]).endswith("Print one integer: the sum.\n\n" + CODE_STDIN_INSTRUCTION)
    assert content(train[1]).endswith("returns an integer.\n\n" + CODE_CALL_INSTRUCTION.format(fn_name="count_vowels"))
    for row in train + val:
        assert "Write Python code to solve" not in content(row)
        assert "Your code" not in content(row)
        assert content(row).count("```python") == 1

    assert "train: read 5 records, kept 2 rows, 2 not in the selected subset, skipped 1 malformed" in stdout
    assert "val: read 4 records, kept 1 rows, 2 not in the selected subset, skipped 1 malformed" in stdout
    assert "2 inputs but 1 outputs" in stdout
    assert "ground_truth is not JSON" in stdout


def test_eurus2_math_cli(tmp_path):
    out = str(tmp_path / "out")
    args = ["--train-file", fixture("eurus2", "train.jsonl"), "--val-file", fixture("eurus2", "validation.jsonl")]
    stdout = run_ok("eurus2.py", "--subset", "math", *args, "--local-dir", out)
    rows = written(out)
    train, val = rows["train"], rows["val"]
    assert [row["data_source"] for row in train + val] == ["eurus2_math"] * 4
    assert [row["reward_model"]["ground_truth"] for row in train] == ["\\frac{1}{2}", "12"]
    assert [row["reward_model"]["ground_truth"] for row in val] == ["12", "9"]
    assert [row["extra_info"]["source"] for row in train] == ["numina_olympiads", "numina_cn_k12"]
    assert content(train[0]) == "Compute $\\int_0^1 x\\,dx$." + MATH_SUFFIX
    assert content(val[1]) == "How many positive divisors does $36$ have?" + MATH_SUFFIX
    assert "train: read 5 records, kept 2 rows, 3 not in the selected subset" in stdout
    assert "malformed" not in stdout


def test_eurus2_code_ground_truth_scores_with_verl_prime_code(eurus2_code_out):
    """verl's local code scorer runs our ground truths: right programs pass, wrong ones do not."""
    from verl.utils.reward_score.prime_code import compute_score

    _, rows = eurus2_code_out
    stdin_gt, call_gt = (row["reward_model"]["ground_truth"] for row in rows["train"])
    lines_gt = rows["val"][0]["reward_model"]["ground_truth"]

    def score(program: str, ground_truth: str) -> float:
        # continuous=True as verl's default_compute_score calls it (continuous=False fails on wrong answers in 0.9.1)
        return float(compute_score(f"Reasoning.\n```python\n{program}\n```", ground_truth, continuous=True)[0])

    assert score("n = int(input())\nprint(sum(map(int, input().split())))", stdin_gt) == 1.0
    assert score("n = int(input())\nprint(n)", stdin_gt) == 0.0
    assert score("def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)", call_gt) == 1.0
    solution_class = "class Solution:\n    def count_vowels(self, s):\n        return sum(c in 'aeiou' for c in s)"
    assert score(solution_class, call_gt) == 1.0
    assert score("def count_vowels(s):\n    return len(s)", call_gt) == 0.0
    assert score("import sys\nprint(max(map(int, sys.stdin.read().split()[1:])))", lines_gt) == 1.0


def test_cli_needs_both_files_and_reports_empty_split(tmp_path, capsys):
    gsm8k_cli = load_cli("gsm8k.py")
    with pytest.raises(SystemExit) as exit_info:
        gsm8k_cli.main(["--train-file", fixture("gsm8k", "train.jsonl"), "--local-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "give both --train-file and --val-file" in capsys.readouterr().err

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "What is 2 + 2?", "answer": "It is four."}) + "\n")
    out = tmp_path / "out"
    args = ["--train-file", fixture("gsm8k", "train.jsonl"), "--val-file", str(bad), "--local-dir", str(out)]
    assert gsm8k_cli.main(args) == 1
    captured = capsys.readouterr()
    assert "val: read 1 records, kept 0 rows, skipped 1 malformed" in captured.out
    assert "field 'answer' has no final '#### <number>' line" in captured.out
    assert "no val rows to write" in captured.err
    assert not out.exists() or not any(out.iterdir())

    with pytest.raises(SystemExit):
        load_cli("eurus2.py").main(["--subset", "both", "--local-dir", str(tmp_path)])


# ----------------------------------------------------------------------------------------------------------------
# Prompt formats and mapping functions
# ----------------------------------------------------------------------------------------------------------------


def test_prompt_formats():
    assert GSM8K_INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'
    assert MATH_INSTRUCTION == "Let's think step by step and output the final answer within \\boxed{}."
    assert gsm8k_prompt("  What is 1+1?\n") == "What is 1+1?" + GSM8K_SUFFIX
    assert math_prompt("Find $x$.") == "Find $x$." + MATH_SUFFIX
    assert code_prompt("Sum them.") == "Sum them.\n\n" + CODE_STDIN_INSTRUCTION
    call = code_prompt("Sum them.", "solve")
    assert call == "Sum them.\n\n" + CODE_CALL_INSTRUCTION.format(fn_name="solve")
    assert "function `solve`" in call and "write `solve` as its method" in call
    with pytest.raises(ValueError, match="non-empty str"):
        math_prompt("   ")


def test_dapo_problem_unwraps_or_keeps_text():
    wrapped = (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is $2+3$?\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    assert dapo_problem(wrapped) == ("What is $2+3$?", True)
    assert dapo_problem("What is $2+3$?") == ("What is $2+3$?", False)
    record = {"prompt": [{"role": "user", "content": "Plain problem text."}], "reward_model": {"ground_truth": 5}}
    row = dapo_row(record, "train", 0)
    assert content(row) == "Plain problem text." + MATH_SUFFIX  # no wrapper: kept as is, our instruction appended
    assert row["reward_model"]["ground_truth"] == "5"
    assert row["extra_info"] == {"split": "train", "index": 0, "problem": "Plain problem text.", "source_index": ""}


def test_dapo_split_dedup_counts_conflicts_and_caps():
    def record(problem, answer):
        return {"prompt": [{"role": "user", "content": problem}], "reward_model": {"ground_truth": answer}}

    records = [record("P  one", "1"), record("P one", "2"), record("P two", "3"), record("P\none", "1")]
    records.append({"prompt": [{"role": "assistant", "content": "no user turn"}], "reward_model": {}})
    records.append(record("P three", "4"))
    rows, report = build_dapo_split(records, "train", "math_dapo")
    assert [row["reward_model"]["ground_truth"] for row in rows] == ["1", "3", "4"]
    assert [row["extra_info"]["index"] for row in rows] == [0, 1, 2]
    assert (report.read, report.written, report.duplicates, report.conflicting_duplicates) == (6, 3, 2, 1)
    assert report.skipped == 1 and "field 'prompt' has no 'user' message" in report.reasons[0]
    capped, capped_report = build_dapo_split(records, "train", "math_dapo", max_samples=2)
    assert [row["reward_model"]["ground_truth"] for row in capped] == ["1", "3"]
    assert capped_report.read == 3


def test_gsm8k_mapping():
    assert gsm8k_ground_truth("So 1000 + 200.\n#### 1,200") == "1200"
    assert gsm8k_ground_truth("#### -3.5 ") == "-3.5"
    with pytest.raises(RecordError, match="field 'answer' has no final"):
        gsm8k_ground_truth("The answer is 4.")
    with pytest.raises(RecordError, match="is not a number"):
        gsm8k_ground_truth("#### four")
    with pytest.raises(RecordError, match="field 'question'"):
        gsm8k_row({"answer": "#### 4"}, "train", 0)
    row = gsm8k_row({"question": "Q?", "answer": "#### 4"}, "val", 7)
    assert row["extra_info"] == {"split": "val", "index": 7, "question": "Q?", "answer": "#### 4"}


def test_eurus2_prompt_cleanup():
    suffix = "\n\nWrite Python code to solve the problem. Present the code in \n```python\nYour code\n```\nat the end."
    assert eurus2_code_problem("Write Python code to solve the task.\nAdd two numbers." + suffix) == "Add two numbers."
    # a variant seen in re-exports: the closing fence and "at the end." on one line
    variant = suffix.replace("```\nat the end.", "``` at the end.")
    assert eurus2_code_problem("Add two numbers." + variant) == "Add two numbers."
    assert eurus2_code_problem("No instructions here.") == "No instructions here."
    assert eurus2_math_problem("Find $y$.\n\nPresent the answer in LaTex format: \\boxed{Your answer}") == "Find $y$."


@pytest.mark.parametrize(
    "tests, expected",
    [
        ({"inputs": ["1\n"], "outputs": ["1\n"]}, {"inputs": ["1\n"], "outputs": ["1\n"]}),
        ({"inputs": [["2", "3 4"]], "outputs": [["7"]]}, {"inputs": ["2\n3 4"], "outputs": ["7"]}),
        ({"inputs": ["1\n"], "outputs": ["1\n"], "fn_name": None}, {"inputs": ["1\n"], "outputs": ["1\n"]}),
        (
            {"fn_name": "f", "inputs": [[1, [2, 3]], ["a\nb"]], "outputs": [[6], "x"]},
            {"inputs": ["1\n[2, 3]", '"a\\nb"'], "outputs": ["[6]", '"x"'], "fn_name": "f"},
        ),
        (
            {"fn_name": "f", "inputs": ["1\n[2, 3]"], "outputs": ["[\n 6\n]"]},
            {"inputs": ["1\n[2, 3]"], "outputs": ["[\n 6\n]"], "fn_name": "f"},
        ),
    ],
)
def test_normalize_code_tests(tests, expected):
    assert json.loads(normalize_code_tests(json.dumps(tests))) == expected
    assert json.loads(normalize_code_tests(tests)) == expected


@pytest.mark.parametrize(
    "ground_truth, message",
    [
        ('{"inputs": ["1"], "outputs": ["1"', "ground_truth is not JSON"),
        ('["1", "1"]', "must be a JSON object"),
        ('{"inputs": ["1"]}', "needs 'inputs' and 'outputs' lists"),
        ('{"inputs": [], "outputs": []}', "'inputs' is empty"),
        ('{"inputs": ["1", "2"], "outputs": ["1"]}', "2 inputs but 1 outputs"),
        ('{"inputs": [1], "outputs": ["1"]}', "inputs[0] must be a str or a list of str lines"),
        ('{"inputs": ["1"], "outputs": [{"a": 1}]}', "outputs[0] must be a str"),
        ('{"fn_name": "not valid", "inputs": [[1]], "outputs": [1]}', "fn_name must be a Python identifier"),
        ('{"fn_name": "f", "inputs": [[1], "2"], "outputs": [1, 2]}', "all be argument lists or all be encoded"),
        ('{"fn_name": "f", "inputs": [[]], "outputs": [1]}', "empty argument list"),
        ('{"fn_name": "f", "inputs": ["x y"], "outputs": ["1"]}', "inputs[0] line"),
        ('{"fn_name": "f", "inputs": ["1"], "outputs": ["two"]}', "outputs[0]"),
        ('{"fn_name": "f", "inputs": ["1"], "outputs": [2]}', "need JSON-encoded str outputs"),
    ],
)
def test_normalize_code_tests_rejects(ground_truth, message):
    with pytest.raises(RecordError, match="code tests") as error:
        normalize_code_tests(ground_truth)
    assert message in str(error.value)


def test_eurus2_rows():
    records = read_records(fixture("eurus2", "train.jsonl"))
    math_row = eurus2_row(records[0], "train", 0)
    assert math_row["data_source"] == "eurus2_math" and math_row["ability"] == "math"
    assert math_row["extra_info"] == {"split": "train", "index": 0, "source": "numina_olympiads", "source_index": "0"}
    code_row = eurus2_row(records[3], "val", 4)
    assert code_row["data_source"] == "eurus2_code" and json.loads(code_row["reward_model"]["ground_truth"])["fn_name"]
    with pytest.raises(RecordError, match="2 inputs but 1 outputs"):
        eurus2_row(records[4], "train", 0)
    with pytest.raises(RecordError, match="field 'ability' is 'chemistry'"):
        eurus2_row(dict(records[0], ability="chemistry"), "train", 0)
    with pytest.raises(RecordError, match="field 'reward_model.ground_truth' is missing"):
        eurus2_row(dict(records[0], reward_model={"style": "rule"}), "train", 0)
    rows, report = build_eurus2_split(records, "train", "code", max_samples=1)
    assert len(rows) == 1 and (report.read, report.not_selected) == (2, 1)
    with pytest.raises(ValueError, match="subset must be one of math, code"):
        build_eurus2_split(records, "train", "all")


def test_map_records_reports_first_reasons():
    def to_row(record, split, index):
        raise RecordError(f"bad {record['n']}")

    report = SplitReport("train")
    assert map_records([{"n": n} for n in range(7)], to_row, report) == []
    assert report.skipped == 7 and report.reasons[0] == "record 0: bad 0" and len(report.reasons) == 5
    assert "... and 2 more skipped" in report.summary()


def test_read_records_formats(tmp_path):
    lines = tmp_path / "lines.json"
    lines.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert read_records(str(lines)) == [{"a": 1}, {"a": 2}]
    listed = tmp_path / "list.json"
    listed.write_text('[{"a": 1}]')
    assert read_records(str(listed)) == [{"a": 1}]
    (tmp_path / "x.csv").write_text("a\n1\n")
    with pytest.raises(ValueError, match="unsupported extension '.csv'"):
        read_records(str(tmp_path / "x.csv"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"broken.jsonl:2: not a JSON object"):
        read_records(str(broken))


# ----------------------------------------------------------------------------------------------------------------
# Schema check
# ----------------------------------------------------------------------------------------------------------------

VALID_ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "2"},
    "extra_info": {"split": "train", "index": 0},
}


def mutated(path: tuple, value) -> dict:
    row = copy.deepcopy(VALID_ROW)
    target = row
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return row


@pytest.mark.parametrize(
    "path, value, message",
    [
        (("ability",), KeyError, "missing column(s) ability"),
        (("data_source",), "", "column 'data_source'"),
        (("data_source",), None, "column 'data_source'"),
        (("ability",), 3, "column 'ability'"),
        (("prompt",), "1+1?", "column 'prompt' must be a list"),
        (("prompt",), [], "column 'prompt' is an empty list"),
        (("prompt", 1, "role"), "assistant", "column 'prompt': the last message is from 'assistant'"),
        (("prompt", 0, "role"), "bot", "column 'prompt': message 0 has role 'bot'"),
        (("prompt", 1, "content"), "  ", "column 'prompt': message 1 (user) needs a non-empty str 'content'"),
        (("prompt", 0), "hi", "column 'prompt': message 0 must be a dict"),
        (("reward_model",), "2", "column 'reward_model' must be a dict"),
        (("reward_model", "style"), "rule-lighteval/MATH_v2", "column 'reward_model': style is"),
        (("reward_model", "ground_truth"), 2, "column 'reward_model': ground_truth must be a str"),
        (("reward_model", "ground_truth"), "", "column 'reward_model': ground_truth is empty"),
        (("extra_info",), None, "column 'extra_info' must be a dict"),
        (("extra_info", "split"), KeyError, "column 'extra_info': 'split'"),
        (("extra_info", "index"), KeyError, "column 'extra_info': 'index'"),
        (("extra_info", "index"), "0", "column 'extra_info': 'index'"),
        (("extra_info", "index"), True, "column 'extra_info': 'index'"),
        (("extra_info", "index"), -1, "column 'extra_info': 'index'"),
    ],
)
def test_schema_rejects_bad_rows(path, value, message):
    check_rl_rows([VALID_ROW])
    with pytest.raises(ValueError) as error:
        check_rl_rows([VALID_ROW, mutated(path, value)])
    assert str(error.value).startswith("row 1: ")
    assert message in str(error.value)


def test_check_rl_parquet(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist([VALID_ROW, VALID_ROW]), good)
    assert check_rl_parquet(good) == 2

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([VALID_ROW, mutated(("reward_model", "style"), "model")]), bad)
    with pytest.raises(ValueError, match=r"bad.parquet: row 1: column 'reward_model': style is 'model'"):
        check_rl_parquet(bad)

    # the file is read in batches of 1024 rows: the row index must still be the row's position in the file
    many = tmp_path / "many.parquet"
    rows = [dict(VALID_ROW, extra_info={"split": "train", "index": i}) for i in range(1030)]
    rows[1027] = dict(rows[1027], ability="")
    pq.write_table(pa.Table.from_pylist(rows), many)
    with pytest.raises(ValueError, match=r"many.parquet: row 1027: column 'ability'"):
        check_rl_parquet(many)

    no_column = tmp_path / "no_column.parquet"
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in VALID_ROW.items() if k != "extra_info"}]), no_column)
    with pytest.raises(ValueError, match=r"missing column\(s\) extra_info"):
        check_rl_parquet(no_column)

    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([VALID_ROW]).slice(0, 0), empty)
    with pytest.raises(ValueError, match="has no rows"):
        check_rl_parquet(empty)

    with pytest.raises(ValueError, match="no such parquet file"):
        check_rl_parquet(tmp_path / "missing.parquet")


def test_schema_accepts_rows_read_with_pandas(gsm8k_out, tmp_path):
    """pandas gives the chat list as a numpy array and ints as numpy ints; the check takes both."""
    import pandas as pd

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(gsm8k_out[1]["train"]), path)
    rows = pd.read_parquet(path).to_dict("records")
    assert type(rows[0]["prompt"]).__name__ == "ndarray"
    check_rl_rows(rows)
