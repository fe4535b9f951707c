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
"""Every existing verl loss, bit for bit: the same computations on two verl trees, compared exactly.

    PYTHONPATH=<verl tree> python upstream/golden.py run OUT.pt
    python upstream/golden.py compare A.pt B.pt

``run`` records, on whatever verl is first on the path (upstream/check.sh: the released tree, then the tree with PR 1):

- ``ppo_loss`` for every registered built-in policy loss × every ``loss_agg_mode`` × entropy bonus on/off × KL loss
  on/off × with/without global-batch normalisation: the loss, the gradient of the log-probs, every metric's values
  and aggregation (or the exception, where a combination raises);
- the FSDP engine's ``prepare_model_outputs`` on both padding branches, entropy on/off (outputs, and the in-place
  flag of every log-prob call), and Megatron's ``_lm_head_logits_processor`` (outputs, whether the cross-entropy ran
  on the logits themselves), on stub engines;
- the v1 trainer's old-log-prob and reference passes (the ``extra_info`` the worker group receives), on a stub;
- verl's real FSDP2 engine on CPU (troll-verl's CPU platform) with a tiny model: for every built-in loss, a fresh
  actor's ``compute_log_prob`` outputs, one ``update_actor`` step's metrics and every parameter after the step.

``compare`` exits 1 naming every entry that differs in any bit (``torch.equal`` on tensors, ``==`` elsewhere).
"""

from __future__ import annotations

import os
import sys
import tempfile

os.environ["VERL_PLATFORM"] = "cpu"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
VOCAB = 32
PROMPTS, RESPONSES = (3, 2, 4), (4, 3, 2)


def _built_in_losses() -> list[str]:
    from verl.trainer.ppo import core_algos

    return sorted(name for name, fn in core_algos.POLICY_LOSS_REGISTRY.items() if fn.__module__.startswith("verl."))


def _actor_config(loss_mode, **kwargs):
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    policy_loss = PolicyLossConfig(loss_mode=loss_mode, dro_beta=0.1 if loss_mode == "dro" else None)
    return FSDPActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy_loss,
                           **kwargs)  # fmt: skip


def _micro_batch(global_info: bool):
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(0)
    keys = ("prompts", "responses", "input_ids", "response_mask", "old_log_probs", "advantages", "ref_log_prob",
            "rollout_is_weights", "rollout_log_probs")  # fmt: skip
    fields = {key: [] for key in keys}
    for p, r in zip(PROMPTS, RESPONSES, strict=True):
        prompt, response = torch.randint(0, VOCAB, (p,), generator=g), torch.randint(0, VOCAB, (r,), generator=g)
        fields["prompts"].append(prompt)
        fields["responses"].append(response)
        fields["input_ids"].append(torch.cat([prompt, response]))
        fields["response_mask"].append(torch.ones(r, dtype=torch.int64))
        for key in ("old_log_probs", "ref_log_prob", "rollout_log_probs"):
            fields[key].append(-torch.rand(r, generator=g) * 2)
        fields["advantages"].append(torch.randn(r, generator=g))
        fields["rollout_is_weights"].append(torch.rand(r, generator=g) + 0.5)
    data = tu.get_tensordict({k: torch.nested.as_nested_tensor(v, layout=torch.jagged) for k, v in fields.items()})
    tu.assign_non_tensor(
        data, dp_size=1, batch_num_tokens=sum(RESPONSES) if global_info else None,
        global_batch_size=len(PROMPTS) if global_info else None,
    )  # fmt: skip
    return data


def _metrics(metrics: dict) -> dict:
    out = {}
    for key, value in metrics.items():
        if hasattr(value, "aggregation"):
            out[key] = (value.aggregation.value, [float(v) for v in value.values])
        else:
            out[key] = value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)
    return out


def ppo_loss_grid() -> dict:
    """``ppo_loss`` for every built-in loss and setting: loss, gradient of the log-probs, metrics."""
    from verl.workers.utils.losses import ppo_loss

    results = {}
    g = torch.Generator().manual_seed(1)
    n_rows = sum(PROMPTS) + sum(RESPONSES)
    log_prob_values = -torch.rand(n_rows, generator=g) * 2
    entropy_values = torch.rand(n_rows, generator=g)
    for name in _built_in_losses():
        for agg in AGG_MODES:
            for entropy in (False, True):
                for kl in (False, True):
                    for global_info in (False, True):
                        key = f"ppo_loss/{name}/{agg}/entropy={entropy}/kl={kl}/global={global_info}"
                        data = _micro_batch(global_info)
                        offsets = data["input_ids"].offsets()
                        leaf = log_prob_values.clone().requires_grad_(True)
                        model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(leaf, offsets)}
                        if entropy:
                            model_output["entropy"] = torch.nested.nested_tensor_from_jagged(entropy_values, offsets)
                        config = _actor_config(name, loss_agg_mode=agg, entropy_coeff=0.01 if entropy else 0.0,
                                               use_kl_loss=kl, kl_loss_coef=0.1)  # fmt: skip
                        try:
                            loss, metrics = ppo_loss(config, model_output=model_output, data=data)
                            loss.backward()
                            results[key] = (loss.detach(), leaf.grad, _metrics(metrics))
                        except Exception as e:  # the same combinations must fail the same way
                            results[key] = ("raised", type(e).__name__, str(e))
    return results


class _Recorder:
    """Stands in for a log-prob kernel; records how it was called."""

    def __init__(self, inplace_input=False):
        self.calls = []
        self.inplace_input = inplace_input

    def __call__(self, logits, labels, inplace_backward=None):
        self.calls.append(inplace_backward)
        out = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        if self.inplace_input:
            logits.mul_(0.5)
        return out


def _dense_entropy(logits: torch.Tensor) -> torch.Tensor:
    return -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)


def engine_outputs() -> dict:
    """The engines' output paths on stubs, without any new flag set."""
    from unittest.mock import patch

    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.dataset_utils import DatasetPadMode
    from verl.utils.torch_functional import entropy_from_logits
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    results = {}
    g = torch.Generator().manual_seed(2)
    lens = torch.tensor([4, 2, 3])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    nnz = int(offsets[-1])
    ids = torch.randint(0, VOCAB, (nnz,), generator=g)
    raw = torch.randn(nnz, VOCAB, generator=g)
    for rmpad in (True, False):
        for entropy in (False, True):
            engine = object.__new__(FSDPEngineWithLMHead)
            engine.use_ulysses_sp = False
            engine.compute_entropy_from_logits = entropy_from_logits  # as __init__ sets it without torch.compile
            engine.engine_config = type("C", (), {"entropy_checkpointing": False,
                                                  "entropy_from_logits_with_chunking": False})()  # fmt: skip

            class _Output:
                pass

            output = _Output()
            if rmpad:
                output.logits = raw.unsqueeze(0).clone()
                args = {"input_ids_rmpad_rolled": torch.roll(ids, -1), "temperature_rmpad": torch.full((nnz,), 0.7),
                        "pad_size": 0}  # fmt: skip
            else:
                padded = torch.zeros(3, 4, VOCAB)
                for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:], strict=True)):
                    padded[i, : b - a] = raw[a:b]
                output.logits = padded
                args = {"input_ids_rmpad_rolled": torch.roll(ids, -1), "temperature": torch.full((3,), 0.7)}
            micro_batch = TensorDict({"input_ids": torch.nested.nested_tensor_from_jagged(ids, offsets)}, [])
            tu.assign_non_tensor(
                micro_batch, use_remove_padding=rmpad, pad_mode=DatasetPadMode.NO_PADDING, use_fused_kernels=False,
                calculate_entropy=entropy, calculate_sum_pi_squared=False,
            )  # fmt: skip
            recorder = _Recorder()
            with patch("verl.workers.engine.fsdp.transformer_impl.logprobs_from_logits", recorder):
                out = engine.prepare_model_outputs(output, args, micro_batch, logits_processor_func=None)
            results[f"fsdp/rmpad={rmpad}/entropy={entropy}"] = (
                {k: v.values() for k, v in out.items()}, recorder.calls,
            )  # fmt: skip
    try:
        from verl.workers.engine.megatron import transformer_impl as mcore
    except ImportError:
        return results
    for entropy in (False, True):
        logits = torch.randn(1, 7, VOCAB, generator=g)
        label = torch.randint(0, VOCAB, (1, 7), generator=g)
        recorder = _Recorder(inplace_input=True)
        engine = object.__new__(mcore.MegatronEngineWithLMHead)
        engine.engine_config = type("C", (), {"entropy_from_logits_with_chunking": False})()
        with (
            patch.object(mcore, "vocab_parallel_log_probs_from_logits", recorder),
            patch.object(mcore, "vocab_parallel_entropy", _dense_entropy),
        ):  # fmt: skip
            ret = engine._lm_head_logits_processor(
                logits, label, torch.full((1, 7), 0.7), calculate_sum_pi_squared=False, calculate_entropy=entropy,
                distillation_use_topk=False, distillation_only=False, logits_processor_func=None, batch=None,
                data_format="thd",
            )  # fmt: skip
        results[f"megatron/entropy={entropy}"] = (ret, recorder.calls, logits)
    return results


def trainer_passes() -> dict:
    """The ``extra_info`` verl's v1 trainer hands the worker group on the old-log-prob and reference passes."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils import tensordict_utils as tu

    class _Meta(SimpleNamespace):
        def __len__(self):
            return len(self.keys)

    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    torch.manual_seed(4)
    store = {
        "log_probs": nested([-torch.rand(5), -torch.rand(6)]),
        "entropy": nested([torch.rand(5), torch.rand(6)]),
        "response_mask": nested([torch.ones(2, dtype=torch.int64), torch.ones(4, dtype=torch.int64)]),
    }
    puts = []
    fake_tq = SimpleNamespace(
        kv_batch_get=lambda keys, partition_id, select_fields: tu.get_tensordict({k: store[k] for k in select_fields}),
        kv_batch_put=lambda keys, partition_id, fields: puts.append({k: v for k, v in fields.items()})
        or _Meta(keys=keys, partition_id=partition_id, extra_info={}),
    )  # fmt: skip
    results = {}
    original = trainer_base.tq
    trainer_base.tq = fake_tq
    try:
        for name in _built_in_losses():
            for ref_in_actor in (False, True):
                seen = []
                trainer = object.__new__(PPOTrainerSync)
                trainer.config = OmegaConf.create({
                    "algorithm": {"rollout_correction": {"bypass_mode": False}},
                    "actor_rollout_ref": {
                        "rollout": {"temperature": 1.0, "calculate_log_probs": False},
                        "actor": {"loss_agg_mode": "token-mean", "loss_scale_factor": None,
                                  "policy_loss": {"loss_mode": name}},
                    },
                })  # fmt: skip
                trainer.ref_in_actor = ref_in_actor

                def record(batch, seen=seen):
                    seen.append(dict(batch.extra_info))
                    return _Meta(keys=batch.keys, extra_info=dict(batch.extra_info))

                trainer.actor_rollout_wg = SimpleNamespace(compute_log_prob=record)
                trainer.ref_policy_wg = SimpleNamespace(compute_ref_log_prob=record)
                batch = _Meta(keys=["a", "b"], partition_id="train", extra_info={})
                trainer._compute_old_log_prob(batch, metrics := {})
                trainer._compute_ref_log_prob(batch, {})
                results[f"trainer/{name}/ref_in_actor={ref_in_actor}"] = (seen, dict(batch.extra_info), metrics)
    finally:
        trainer_base.tq = original
    results["trainer/puts"] = puts
    return results


def real_engine() -> dict:
    """One fresh FSDP2 actor per built-in loss on CPU: compute_log_prob outputs, one update step, the parameters."""
    from troll_verl.testing.verl_engine import init_single_process_group

    init_single_process_group()
    with tempfile.TemporaryDirectory(prefix="golden_model_") as model_dir:
        return _real_engine_on(model_dir)


def _real_engine_on(model_dir: str) -> dict:
    """:func:`real_engine`'s runs, the tiny Qwen2 saved in ``model_dir``."""
    from hydra import compose, initialize_config_dir
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.padding import response_from_nested

    from troll_verl.platform.cpu import CPU_ENGINE_OVERRIDES

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    Qwen2ForCausalLM(cfg).save_pretrained(model_dir)
    import verl

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    results = {}
    for name in _built_in_losses():
        overrides = [
            f"actor_rollout_ref.model.path={model_dir}", *CPU_ENGINE_OVERRIDES,
            "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.optim.lr=1e-2",
            f"actor_rollout_ref.actor.policy_loss.loss_mode={name}", "actor_rollout_ref.actor.entropy_coeff=0.01",
            *(["actor_rollout_ref.actor.policy_loss.dro_beta=0.1"] if name == "dro" else []),
        ]  # fmt: skip
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            config = compose("ppo_trainer", overrides=overrides)
        torch.manual_seed(0)
        worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
        worker.init_model()
        data = _micro_batch(global_info=False)
        for key in ("ref_log_prob", "rollout_is_weights", "rollout_log_probs", "old_log_probs", "advantages"):
            data.pop(key)
        data["position_ids"] = torch.nested.as_nested_tensor(
            [torch.arange(p + r) for p, r in zip(PROMPTS, RESPONSES, strict=True)], layout=torch.jagged
        )
        data["loss_mask"] = data["response_mask"]
        old = data.clone()
        tu.assign_non_tensor(old, calculate_entropy=True, compute_loss=False, temperature=1.0)
        try:
            out = worker.compute_log_prob(old)
            update = data.clone()
            update["old_log_probs"] = response_from_nested(out["log_probs"], data["response_mask"])
            g = torch.Generator().manual_seed(3)
            update["advantages"] = torch.nested.as_nested_tensor(
                [torch.randn(r, generator=g) for r in RESPONSES], layout=torch.jagged
            )
            tu.assign_non_tensor(update, calculate_entropy=True, temperature=1.0, global_batch_size=3,
                                 mini_batch_size=3, epochs=1, seed=0, dataloader_kwargs={"shuffle": False})  # fmt: skip
            metrics = worker.update_actor(update)["metrics"]
            params = {k: v.detach().clone() for k, v in worker.actor.engine.module.state_dict().items()}
            params = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in params.items()}
            metrics = {k: v for k, v in metrics.items() if not k.startswith(("perf/", "mfu"))}  # timing, memory
            results[f"engine/{name}"] = (
                {k: out[k].values() for k in ("log_probs", "entropy")}, _metrics(metrics), params,
            )  # fmt: skip
        except Exception as e:
            results[f"engine/{name}"] = ("raised", type(e).__name__, str(e))
        del worker
    return results


def run(out: str) -> None:
    """Record every computation of the module docstring into ``out``."""
    torch.set_num_threads(1)
    import verl

    results = {"verl_file": verl.__file__}
    for part in (ppo_loss_grid, engine_outputs, trainer_passes, real_engine):
        results.update(part())
        print(f"[golden] {part.__name__}: done", flush=True)
    torch.save(results, out)
    print(f"[golden] {len(results) - 1} entries from {verl.__file__} -> {out}")


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.is_nested != b.is_nested:
            return False
        if a.is_nested:  # a jagged shape's symbolic dim (j0, j1, ...) is a per-process counter: compare the layout
            return _same(a.offsets(), b.offsets()) and _same(a.values(), b.values())
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def compare(path_a: str, path_b: str) -> int:
    """Exit status 0 if both recordings agree in every bit; name every entry that does not."""
    a, b = torch.load(path_a, weights_only=False), torch.load(path_b, weights_only=False)
    a.pop("verl_file"), b.pop("verl_file")
    keys = sorted(set(a) | set(b))
    differ = [k for k in keys if k not in a or k not in b or not _same(a[k], b[k])]
    kinds = {}
    for k in keys:
        kinds.setdefault(k.split("/")[0], [0, 0])[k in differ] += 1
    for kind, (same, diff) in sorted(kinds.items()):
        print(f"  {kind:9s} {same + diff:4d} entries, {diff} differ")
    raised = sum(1 for k in keys if isinstance(a.get(k), tuple) and a[k][:1] == ("raised",))
    print(f"[golden] {len(keys)} entries ({raised} raise on both trees), {len(differ)} differ")
    for k in differ[:20]:
        print(f"    differs: {k}")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
