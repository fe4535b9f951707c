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
"""Helpers for tests on verl's real FSDP2 engine, in-process on CPU: tiny Qwen2 models, configs, v1-style batches."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import troll_verl
from troll_verl.platform.cpu import CPU_ENGINE_OVERRIDES

# CPU settings that make verl's FSDP2 engine exact on CPU (see troll_verl/platform/cpu.py).
CPU_OVERRIDES = [
    *CPU_ENGINE_OVERRIDES,
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.optim.lr=1e-2",
    "actor_rollout_ref.actor.optim.weight_decay=0.0",
    "actor_rollout_ref.actor.grad_clip=1000.0",
    "actor_rollout_ref.actor.optim.clip_grad=1000.0",
]


def free_port() -> int:
    """A TCP port free on this machine right now (for a one-process torch.distributed group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_process_group() -> None:
    """A world-size-1 gloo group for in-process engines (what verl's Ray workers would set up)."""
    if dist.is_initialized():
        return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)


def tiny_model_dir(
    path: str, vocab: int = 128, layers: int = 2, seed: int = 0, mix_positions: bool = True, hidden: int = 32,
    heads: int = 4, intermediate: int | None = None, arch: str = "qwen2", tie: bool = False, head_scale: float = 40.0,
) -> str:  # fmt: skip
    """Save a random tiny Qwen2 (fp32) to ``path`` and return it.

    ``mix_positions=False`` zeroes every attention output projection, so each position's logits depend on its own
    token only (used to test sequence-parallel bookkeeping without a sequence-parallel attention kernel). vLLM's CPU
    attention needs a head dimension ``hidden // heads`` of 32 or more.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
                             "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]  # fmt: skip
    extra = {"head_dim": hidden // heads} if arch == "qwen3" else {}  # Qwen3's default head_dim is 128
    cfg = config_cls(
        **extra,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=256,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(seed)
    model = model_cls(cfg)
    with torch.no_grad():  # peakier than the default init (head_scale), so the mass rule keeps a few tokens
        model.lm_head.weight.mul_(head_scale)
        if not mix_positions:
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
    model.save_pretrained(path)
    return path


def compose_config(model_path: str, *overrides: str, base=CPU_OVERRIDES, verls_own: bool = False) -> DictConfig:
    """troll_trainer.yaml (verl's ppo_trainer + TROLL) with ``base`` settings (the exact CPU ones by default) and
    ``overrides``; ``verls_own``: verl's own ``ppo_trainer.yaml`` instead (what ``python -m verl.trainer.main_ppo``
    composes), where TROLL is only what ``overrides`` select."""
    import verl

    if verls_own:
        config_dir, name = os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), "ppo_trainer"
    else:
        config_dir, name = os.path.join(os.path.dirname(troll_verl.__file__), "config"), "troll_trainer"
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(name, overrides=[f"actor_rollout_ref.model.path={model_path}", *base, *overrides])


def make_actor_worker(config: DictConfig, role: str = "actor"):
    """verl's ``ActorRolloutRefWorker``, in this process, with its model initialised: its actor training worker is
    TROLL's (installed by the plugin, :class:`~troll_verl.integration.workers.TrollActorTrainingWorker`)."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    init_single_process_group()
    # verl's trainers hand the actor worker the run's distillation settings too (trainer_base.py, ray_trainer.py)
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role=role, distillation_config=config.get("distillation"))
    worker.init_model()
    return worker


def kept_old_fields(worker, batch) -> dict:
    """The old top-K TROLL's actor training worker kept for ``batch``'s sequences, as nested ``(bsz, j, ...)``
    tensors (:data:`~troll_verl.core.layout.OLD_FIELDS`); raises where a sequence is not kept."""
    fields, hits = worker.actor.old_topk_cache.take(batch, check_log_probs=False)
    if fields is None:
        raise AssertionError(f"the worker kept the old top-K of {hits} of the batch's sequences, not all")
    return fields


def make_batch(vocab: int, prompt_lens, response_lens, seed: int = 0):
    """A batch in verl v1's TransferQueue layout: nested prompts/responses/input_ids/position_ids/masks."""
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    fields = []
    for p, r in zip(prompt_lens, response_lens, strict=True):
        prompts = torch.randint(0, vocab, (p,), generator=g)
        responses = torch.randint(0, vocab, (r,), generator=g)
        input_ids = torch.cat([prompts, responses])
        fields.append(
            {
                "prompts": prompts,
                "responses": responses,
                "response_mask": torch.ones(r, dtype=torch.int64),
                "loss_mask": torch.ones(r, dtype=torch.int64),
                "input_ids": input_ids,
                "position_ids": torch.arange(p + r),
            }
        )
    nested = {key: torch.nested.as_nested_tensor([f[key] for f in fields], layout=torch.jagged) for key in fields[0]}
    return tu.get_tensordict(nested)


def with_kept_old_fields(worker, batch, output):
    """``output`` of :func:`old_pass` with the old top-K TROLL's worker kept for ``batch`` added (a test that changes
    the old distribution before the update hands it on the batch, :func:`update_batch`); as is on the seam."""
    from troll_verl.integration import seam

    if seam.route() == seam.STOCK:
        output.update(kept_old_fields(worker, batch))
    return output


def old_pass(worker, batch, temperature: float, store: bool = True, **flags):
    """The old-log-prob pass as verl's trainer issues it; TROLL's actor training worker keeps the old top-K
    (:func:`kept_old_fields`). On a verl with the seam, with ``calculate_old_topk`` (``store=False``: without, a
    reference-style pass) and TROLL's old top-K derived from verl's stored one (``troll_old_*`` response-aligned)
    added to the output."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.padding import response_from_nested

    from troll_verl.core.layout import OLD_FIELDS, OLD_TOPK_KEYS
    from troll_verl.core.losses import troll_old_fields
    from troll_verl.integration import seam

    on_seam = seam.route() == seam.SEAM and store
    cfg = omega_conf_to_dataclass(worker.config.actor.policy_loss).troll if on_seam else None
    data = batch.clone()
    tu.assign_non_tensor(
        data,
        calculate_entropy=True,
        compute_loss=False,
        temperature=temperature,
        **({"calculate_old_topk": cfg.topk} if on_seam else {}),
        **flags,
    )
    output = worker.compute_log_prob(data)
    if on_seam and output is not None:  # None on a rank that returns no output; verl cuts the top-K to the responses
        mask = batch["response_mask"]
        stored = tu.get_tensordict({key: response_from_nested(output[key], mask) for key in OLD_TOPK_KEYS})
        derived = troll_old_fields(stored, cfg)
        for key in OLD_FIELDS:
            output[key] = derived[key]
    return output


def update_batch(
    batch, old_output, advantages: torch.Tensor, temperature: float, mini_batch_size: int, troll=True, epochs: int = 1
):
    """The update pass's input: the batch plus the old pass's outputs, as verl's trainer assembles it (``troll``: on a
    verl with the seam, with the seam's flag). ``troll_old_*`` fields in ``old_output`` (the seam's, or a test's
    own) go on the batch, as bypass mode's rollout top-K does; without them TROLL's worker takes the ones it kept.
    ``epochs``: verl's ``ppo_epochs``, passes over the batch in this one update."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested

    from troll_verl.integration import seam

    data = batch.clone()
    data["old_log_probs"] = response_from_nested(old_output["log_probs"], batch["response_mask"])
    for key in old_output.keys():
        if key.startswith("troll_old_"):
            data[key] = old_output[key]
    lens = batch["response_mask"].offsets().diff()
    data["advantages"] = torch.nested.as_nested_tensor(
        [advantages[i, : int(n)].float() for i, n in enumerate(lens)], layout=torch.jagged
    )
    tu.assign_non_tensor(
        data,
        calculate_entropy=False,
        temperature=temperature,
        global_batch_size=mini_batch_size,
        mini_batch_size=mini_batch_size,
        epochs=epochs,
        seed=0,
        dataloader_kwargs={"shuffle": False},
        **({"policy_loss_logits": True} if troll and seam.route() == seam.SEAM else {}),
    )
    return data


def group_probe_class():
    """A verl worker (``Worker``) that sets up nothing itself and reports its process group: ``group()`` returns
    ``(backend, world size, rank)``, or None without one (tests of the CPU platform's Ray set-up hook). Defined here,
    not in a test module, so that Ray's workers can import it."""
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register

    class GroupProbe(Worker):
        @register(dispatch_mode=Dispatch.ALL_TO_ALL)
        def group(self):
            return _process_group()

    return GroupProbe


def _process_group():
    return (dist.get_backend(), dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else None
