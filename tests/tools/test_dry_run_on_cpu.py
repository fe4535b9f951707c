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
"""Unit tests of troll_verl.tools.dry_run's parts that need no Hydra run (the recipes' end-to-end dry runs are in
test_recipes_on_cpu.py): the switch, model loading swapped out, start-up checks, recorded commands, the batch CLI."""

import json
import subprocess
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from verl.workers.config import FSDPEngineConfig, McoreEngineConfig

from troll_verl.tools import dry_run as dr
from troll_verl.tools import verl_startup_checks


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), (" YES ", True), ("0", False), ("", False)])
def test_dry_run_requested(value, expected):
    assert dr.dry_run_requested({dr.DRY_RUN_ENV: value}) is expected
    assert dr.dry_run_requested({}) is False


def test_unloaded_model_config_reads_nothing():
    """A hub id that does not exist: verl's HFModelConfig would try to download it, the dry run's does not."""
    cfg = dr.UnloadedHFModelConfig(path="no-such-org/no-such-model")
    assert cfg.hf_config_path == cfg.tokenizer_path == "no-such-org/no-such-model"


def test_without_model_loading_swaps_only_hf_model_sections():
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"_target_": "verl.workers.config.HFModelConfig", "path": "m"}},
            "critic": {"model": {"_target_": "some.other.ModelConfig", "path": "m"}},
        }
    )
    assert dr.without_model_loading(config) is config
    assert config.actor_rollout_ref.model._target_ == "troll_verl.tools.dry_run.UnloadedHFModelConfig"
    assert config.critic.model._target_ == "some.other.ModelConfig"


@pytest.mark.parametrize(
    "args, variant",
    [
        (("troll", "grpo", True, "token-mean", "token"), "grpo"),
        (("troll", "grpo", False, "seq-mean-token-sum-norm", "token"), "drgrpo"),
        (("troll", "grpo", True, "seq-mean-token-mean", "sequence"), "gspo"),
        (("gspo", "grpo", True, "seq-mean-token-mean", None), "gspo"),
        (("vanilla", "gae", True, "token-mean", None), "ppo"),
        (("vanilla", "rloo", True, "token-mean", None), "rloo"),
    ],
)
def test_infer_variant(args, variant):
    assert dr._infer_variant(*args) == variant


def _startup(
    n_gpus=8,
    rollout_tp=2,
    engine=None,
    batch=256,
    mini=32,
    budget=4096,
    longest=(1024, 2048),
    critic=None,
    per_node=None,
):
    """check_startup's inputs with stand-ins for the dataclasses (only the fields it reads)."""
    config = OmegaConf.create(
        {
            "trainer": {"n_gpus_per_node": n_gpus, "nnodes": 1},
            "data": {"train_batch_size": batch, "max_prompt_length": longest[0], "max_response_length": longest[1]},
            "actor_rollout_ref": {
                "actor": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": budget},
                "rollout": {"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": budget},
            },
        }
    )
    actor = SimpleNamespace(engine=engine or FSDPEngineConfig(), ppo_mini_batch_size=mini)
    rollout = SimpleNamespace(
        tensor_model_parallel_size=rollout_tp,
        data_parallel_size=1,
        pipeline_model_parallel_size=1,
        n_gpus_per_node=per_node or n_gpus,
    )
    return verl_startup_checks.check_startup(config, actor, rollout, use_ref=False, critic=critic)


def test_check_startup_accepts_the_recipe_defaults():
    assert _startup() == []
    assert _startup(engine=McoreEngineConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)) == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rollout_tp": 3}, "infer_world_size"),
        ({"engine": McoreEngineConfig(tensor_model_parallel_size=3)}, "Megatron model parallel size 3"),
        ({"engine": McoreEngineConfig(tensor_model_parallel_size=4, context_parallel_size=4)}, "parallel size 16"),
        ({"batch": 16}, r"train_batch_size \(16\) must be >= "),
        ({"budget": 3000}, r"ppo_max_token_len_per_gpu=3000 .* Set actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
        ({"rollout_tp": 12, "n_gpus": 24, "per_node": 8}, "must fill whole nodes"),  # 12-GPU replicas, 8-GPU nodes
        # verl's v1 trainer runs the critic with ppo_infer_max_token_len_per_gpu, whatever critic.use_dynamic_bsz says
        (
            {"critic": SimpleNamespace(engine=FSDPEngineConfig(), ppo_infer_max_token_len_per_gpu=2048)},
            r"critic.ppo_infer_max_token_len_per_gpu=2048",
        ),
    ],
)
def test_check_startup_names_the_setting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _startup(**kwargs)


def test_check_startup_warns_on_a_batch_that_is_not_a_multiple():
    (warning,) = _startup(batch=100)
    assert "not a multiple" in warning


def test_format_summary_ends_with_a_json_line():
    summary = {"variant": "grpo", "kl_bound": 0.05, "data_files_missing": ["/x/train.parquet"], "warnings": ["w"]}
    text = dr.format_summary(summary)
    assert "[TROLL dry run] note: data file not found here: /x/train.parquet" in text
    assert "[TROLL dry run] warning: w" in text
    last = text.splitlines()[-1]
    assert last.startswith("[TROLL dry run] json ") and json.loads(last.split(" json ", 1)[1]) == summary


def test_read_command_round_trips_a_bash_record(tmp_path):
    """The recipes record with bash's printf '%s\\0'; every argument comes back verbatim."""
    args = ["-m", "troll_verl.main", "a.b='x y'", 'c="q"', "+d=[1,2]", "e=$HOME", ""]
    record = tmp_path / "cell.cmd"
    subprocess.run(["bash", "-c", 'printf "%s\\0" "${@:2}" > "$1"', "_", str(record), *args], check=True)
    assert dr.read_command(str(record)) == args[2:]


@pytest.mark.parametrize("content", [b"-m\0verl.trainer.main_ppo\0x=1\0", b"-c\0print(1)\0", b""])
def test_read_command_refuses_other_commands(tmp_path, content):
    record = tmp_path / "cell.cmd"
    record.write_bytes(content)
    with pytest.raises(ValueError, match="does not record a `-m troll_verl.main` command"):
        dr.read_command(str(record))


def test_main_reports_unreadable_records(tmp_path, capsys):
    bad = tmp_path / "bad.cmd"
    bad.write_bytes(b"-c\0print(1)\0")
    assert dr.main([str(bad), str(tmp_path / "missing.cmd")]) == 1
    out = capsys.readouterr().out
    assert "[TROLL dry run] === bad (1/2) ===" in out and "result missing: FAILED (exit status 2)" in out
    assert out.rstrip().endswith("2 of 2 commands checked: 0 OK, 2 failed (bad, missing)")
    assert dr.main(["--stop-on-failure", str(bad), str(tmp_path / "missing.cmd")]) == 1
    assert "1 of 2 commands checked: 0 OK, 1 failed (bad)" in capsys.readouterr().out


@pytest.mark.parametrize("sp", [1, 2])
def test_the_token_budget_check_refuses_exactly_what_verls_batching_refuses(sp):
    """The copy of seqlen_balancing's budget assertion against verl's own function: at the longest sequence's length
    (the engine hands rearrange_micro_batches the budget times the sequence-parallel size) both accept, one token
    less both refuse."""
    import torch
    from tensordict import TensorDict
    from verl.utils.seqlen_balancing import rearrange_micro_batches

    prompt, response = 24, 40
    longest = prompt + response
    batch = TensorDict(
        {
            "input_ids": torch.ones(4, longest, dtype=torch.long),
            "attention_mask": torch.ones(4, longest, dtype=torch.long),
        },
        batch_size=[4],
    )
    engine = FSDPEngineConfig(ulysses_sequence_parallel_size=sp)
    verdicts = []
    for budget in (-(-longest // sp), -(-longest // sp) - 1):
        try:
            rearrange_micro_batches(batch, max_token_len=budget * sp)
            verl_accepts = True
        except AssertionError:
            verl_accepts = False
        try:
            _startup(n_gpus=2, rollout_tp=1, engine=engine, batch=4, mini=2, budget=budget, longest=(prompt, response))
            dry_run_accepts = True
        except ValueError:
            dry_run_accepts = False
        verdicts.append((verl_accepts, dry_run_accepts))
    assert verdicts == [(True, True), (False, False)]


@pytest.mark.parametrize("rollout_tp, per_node", [(12, 8), (16, 8), (4, 8), (3, 2), (6, 4)])
def test_the_replica_check_refuses_exactly_what_verls_replica_refuses(rollout_tp, per_node):
    """The copy of RolloutReplica's node-tiling assertion against verl's own constructor (a replica that launches
    nothing): both accept or both refuse."""
    from verl.workers.config import RolloutConfig
    from verl.workers.rollout.replica import RolloutReplica

    class Replica(RolloutReplica):
        async def launch_servers(self):
            raise AssertionError("not launched in this test")

    try:
        Replica(0, RolloutConfig(name="vllm", tensor_model_parallel_size=rollout_tp), None, gpus_per_node=per_node)
        verl_accepts = True
    except AssertionError:
        verl_accepts = False
    try:
        # a cluster the colocated rollout tiles (the other check), so that only the replica's shape decides
        _startup(n_gpus=rollout_tp * per_node, rollout_tp=rollout_tp, per_node=per_node)
        dry_run_accepts = True
    except ValueError as e:
        assert "must fill whole nodes" in str(e)
        dry_run_accepts = False
    assert dry_run_accepts == verl_accepts


# ------------------------------------------------------------------------------------------------------------
# trainer modes: the whole dry run (compose, prepare, dataclasses, start-up checks) per verl trainer mode
# ------------------------------------------------------------------------------------------------------------
SEPARATE_ASYNC = [
    "trainer.v1.trainer_mode=separate_async",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=2",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    "trainer.v1.separate_async.parameter_sync_step=2",
    "data.train_batch_size=8",
]


def _dry_run(*overrides):
    from troll_verl.main import prepare
    from troll_verl.testing.verl_engine import compose_config

    config = compose_config(
        "/nonexistent", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=vllm", *overrides
    )
    return dr.dry_run(prepare(dr.without_model_loading(config)))


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_dry_run_accepts_troll_in_each_colocated_mode(gpu_node_env, mode):
    summary = _dry_run(f"trainer.v1.trainer_mode={mode}", "actor_rollout_ref.actor.policy_loss.kernels=torch")
    assert summary["trainer_mode"] == mode and summary["loss_mode"] == "troll" and summary["warnings"] == []
    assert summary["kernels"] == "torch"  # the config's kernel choice, reported


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_dry_run_accepts_troll_in_bypass_mode(gpu_node_env, mode):
    """The old distribution from the rollout (troll_verl.bypass.mode): verl's bypass mode with TROLL validates."""
    summary = _dry_run(f"trainer.v1.trainer_mode={mode}", "algorithm.rollout_correction.bypass_mode=true")
    assert summary["loss_mode"] == "troll" and summary["warnings"] == []


def test_dry_run_validates_separate_async_and_says_it_has_not_run(gpu_node_env):
    summary = _dry_run(*SEPARATE_ASYNC)
    assert summary["trainer_mode"] == "separate_async"
    (warning,) = summary["warnings"]
    assert "separate_async with TROLL has not run end to end" in warning


@pytest.mark.parametrize(
    "override, match",
    [
        ("data.train_batch_size=16", r"data.train_batch_size \(16\) = .*parameter_sync_step \(2\) x .* set data"),
        ("actor_rollout_ref.rollout.nnodes=0", r"actor_rollout_ref.rollout.nnodes > 0"),
        ("actor_rollout_ref.rollout.n_gpus_per_node=1", r"rollout pool \(1 GPUs .* holds no replica of 2 GPUs"),
        ("actor_rollout_ref.rollout.checkpoint_engine.backend=naive", r"checkpoint_engine.backend to nccl"),
    ],
)
def test_dry_run_refuses_what_separate_async_cannot_run(gpu_node_env, override, match):
    with pytest.raises(ValueError, match=match):
        _dry_run(*SEPARATE_ASYNC, override)
