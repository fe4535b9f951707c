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
"""The one module where troll-verl meets verl's registries. Importing it registers; the only verl attributes it sets
are the actor worker's two worker-class hooks, which verl declares for that purpose.

verl imports every entry point of the group ``verl.plugins`` at the end of ``import verl`` (driver, TaskRunner and
every Ray worker), and swallows a failing plugin at DEBUG level. troll-verl's entry point is this module; the
alternative is ``VERL_USE_EXTERNAL_MODULES=troll_verl.integration.plugin``. Either way :func:`register` runs and adds:

==========================  ========================================  =====================================
what                        verl registry                             when
==========================  ========================================  =====================================
policy loss ``troll``       ``core_algos.POLICY_LOSS_REGISTRY``       when ``verl.trainer.ppo.core_algos`` loads
(with its logits hooks                                                (the hooks: only where verl has the
as ``PolicyLossSpec``)                                                policy-loss logits seam, see below)
TROLL's actor training      ``ActorRolloutRefWorker.actor_worker_cls``  when ``verl.workers.engine_workers``
worker (the CPU             (and ``ref_worker_cls`` on the CPU        loads
platform's reference        platform)
worker)
rollout ``vllm`` (verl's    ``rollout.replica.RolloutReplicaRegistry``  when ``verl.workers.rollout.replica``
with bypass mode's top-K                                              loads
where the rollout config
asks for it; the CPU
refit on the CPU platform)
platform ``cpu``            ``plugin.platform.PlatformRegistry``      now, only with ``VERL_PLATFORM=cpu``
FSDP engines for ``cpu``    ``workers.engine.EngineRegistry``         when ``verl.workers.engine`` loads, only
                                                                      with ``VERL_PLATFORM=cpu``
its trainer-side sender     ``rollout.base`` ``("vllm", "async")``    when ``verl.workers.rollout.base``
(CPU, replaces verl's)                                                loads, only with ``VERL_PLATFORM=cpu``
agent loop                  verl's agent-loop registry (``register``)  when verl's single-turn agent loop
``seeded_single_turn_agent``                                          loads (the module registers itself)
the Triton kernels          the core's ``fast_paths`` (not verl's)    with the policy loss (the package
                                                                      registers them when imported)
the ablations (solver,      the core's ``variants`` (not verl's)      with the policy loss and with
tail, old-side estimates)                                             TROLL's settings (likewise)
==========================  ========================================  =====================================

Every registration is in this module, but for the agent loop, which registers itself with verl's decorator when
this module loads it (:mod:`troll_verl.rollout.agent_loop`). No trainer is registered: verl's own trainers run TROLL
through its actor worker, and what else a run needs goes through verl's config keys (``python -m troll_verl.main``).
Each waits for its registry's module (a post-import hook: :func:`when_imported`) so that ``import verl`` stays
cheap. NOTE: measured (docs/benchmarks.md, "Plugin import cost"): ``import verl`` takes 4.1 s here, and importing
the four registry modules eagerly adds 4.2 s to every process that imports verl (Ray's TaskRunner, workers, vLLM
servers, agent-loop and reward workers), paid at every run's start-up; with the hooks each process pays only for
the registries it uses. verl overwrites policy losses silently, so a name already taken by someone else is refused
here.

**The worker.** verl's actor worker builds its training worker from the class attribute ``actor_worker_cls``; the
plugin sets it to :class:`~troll_verl.integration.workers.TrollActorTrainingWorker`, which is verl's
``TrainingWorker`` for every loss but ``troll`` and runs TROLL's two passes for ``troll``
(:mod:`troll_verl.integration.workers`). So ``policy_loss.loss_mode=troll`` alone selects TROLL on every verl
trainer that builds verl's actor worker.

**Two routes, chosen once, at registration.** Where verl has the policy-loss logits seam
(``core_algos.PolicyLossSpec``: upstream B and C, see ``upstream/``;
:func:`troll_verl.integration.seam.route`), loss ``troll`` is :func:`troll_policy_loss_seam`, registered with
its update hook (:func:`troll_verl.core.losses.troll_logits_fn` on the old top-K that verl's old-log-prob pass
stores with ``actor.calculate_old_topk``, :func:`troll_verl.core.losses.troll_old_fields`), and verl's engines,
workers, trainers and ``ppo_loss`` run TROLL unchanged. On verl 0.9 as released it is
:func:`troll_policy_loss_stock`, and TROLL's actor training worker routes the passes through verl's distillation
logits hook instead (:mod:`troll_verl.integration.loss_fn`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import sys
import threading
from collections.abc import Callable

from ..compat import (
    VerlVersionError,
    check_verl_capabilities,
    engine_registry_entry,
    is_verls_rollout_loader,
    registered_policy_loss,
    rollout_class_path,
    rollout_replica_loader,
    set_rollout_class_path,
)
from . import seam
from .checks import POLICY_LOSS_NAME

logger = logging.getLogger(__name__)

VLLM_ROLLOUT_NAME = "vllm"

__all__ = [
    "register",
    "when_imported",
    "troll_logits_hook",
    "troll_policy_loss_spec",
    "troll_spec_fields",
    "troll_policy_loss_seam",
    "troll_policy_loss_stock",
    "load_vllm_replica",
    "POLICY_LOSS_NAME",
    "VLLM_ROLLOUT_NAME",
]


# ------------------------------------------------------------------------------------------------------------
# post-import hooks
# ------------------------------------------------------------------------------------------------------------
class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs callbacks right after a named module has finished executing (once)."""

    def __init__(self):
        self.pending: dict[str, list[Callable]] = {}
        self._lock = threading.Lock()

    def find_spec(self, fullname, path=None, target=None):
        with self._lock:
            if fullname not in self.pending:
                return None
            callbacks = self.pending.pop(fullname)
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _CallbackLoader(spec.loader, callbacks)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader, callbacks):
        self._loader, self._callbacks = loader, callbacks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        for callback in self._callbacks:
            callback(module)

    def __getattr__(self, name):  # get_source, get_code, ... for tracebacks and inspect
        return getattr(self._loader, name)


_FINDER = _PostImportFinder()


def when_imported(module_name: str, callback: Callable) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported (at once if it already is)."""
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
        return
    with _FINDER._lock:
        _FINDER.pending.setdefault(module_name, []).append(callback)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


# ------------------------------------------------------------------------------------------------------------
# the registrations
# ------------------------------------------------------------------------------------------------------------
def _troll_config(config):
    """The actor config, refused with the fix named where it carries no TROLL settings (``policy_loss.troll``)."""
    policy_loss = getattr(config, "policy_loss", None)
    if not hasattr(policy_loss, "troll"):
        raise ValueError(
            "loss_mode=troll reads its settings from troll_verl.config.TrollPolicyLossConfig, but the actor's "
            f"policy_loss is {type(policy_loss).__name__}. Run through python -m troll_verl.main, or set "
            "actor_rollout_ref.actor.policy_loss._target_=troll_verl.config.TrollPolicyLossConfig."
        )
    return config


def troll_policy_loss_seam(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
    rollout_is_weights=None, **kwargs,
):  # fmt: skip
    """verl's ``PolicyLossFn`` for ``loss_mode=troll`` on a verl with the seam: verl's ``ppo_loss`` passes TROLL's terms
    as ``logits_outputs`` to :func:`troll_verl.core.losses.compute_policy_loss_troll`.

    A lazy forwarder, so that registering never imports the loss module while verl's registry module is still
    loading (and ``import verl`` stays cheap).
    """
    from troll_verl.core.losses import compute_policy_loss_troll

    return compute_policy_loss_troll(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        _troll_config(config),
        rollout_is_weights,
        **kwargs,
    )


def troll_policy_loss_stock(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
    rollout_is_weights=None,
):  # fmt: skip
    """verl's ``PolicyLossFn`` for ``loss_mode=troll`` on verl 0.9 as released (no seam): the terms come from TROLL's
    final loss call, :func:`troll_verl.integration.loss_fn.stock_policy_loss` (a lazy forwarder, as the seam's)."""
    from .loss_fn import stock_policy_loss

    return stock_policy_loss(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )


def troll_logits_hook(logits, data, config, data_format="thd"):
    """The seam's update-pass hook for ``troll`` (a lazy forwarder): :func:`troll_verl.core.losses.troll_logits_fn` on
    the micro-batch with TROLL's old top-K derived from verl's named old-pass output
    (:func:`troll_verl.core.losses.troll_old_fields`)."""
    from troll_verl.core.losses import troll_logits_fn, troll_old_fields

    config = _troll_config(config)
    return troll_logits_fn(logits, troll_old_fields(data, config.policy_loss.troll), config, data_format)


def troll_spec_fields() -> dict:
    """What loss ``troll`` asks of verl's engine on a verl with the seam: the fields of verl's
    ``core_algos.PolicyLossSpec`` (:data:`troll_verl.integration.seam.SEAM_SPEC_FIELDS`): the update pass's hook on
    the logits (behind the forwarder that checks the actor config carries TROLL's settings), the outputs it hands on,
    and its own log-probs in place of the engine's. The old top-K comes from verl's named old-pass output
    (``OLD_TOPK_KEYS``, ``actor.calculate_old_topk``), mapped by :func:`troll_verl.core.losses.troll_old_fields`.

    NOTE: built from :mod:`troll_verl.core.terms`, not :mod:`troll_verl.core.losses`: this runs when verl's
    ``core_algos`` is first imported, which may be from inside ``troll_verl.core.losses``'s own import.
    """
    from troll_verl.core.terms import TROLL_LOGITS_OUTPUT_KEYS

    return {"logits_fn": troll_logits_hook, "logits_output_keys": TROLL_LOGITS_OUTPUT_KEYS, "provides_log_probs": True}


def troll_policy_loss_spec(core_algos):
    """TROLL's ``PolicyLossSpec`` on a verl with the seam: :func:`troll_spec_fields`."""
    return core_algos.PolicyLossSpec(**troll_spec_fields())


def _register_policy_loss(core_algos) -> None:
    """Register loss ``troll`` for the route this verl offers, chosen once here: the seam's forwarder with its spec
    where verl has the seam (:func:`troll_verl.integration.seam.route`), else the stock route's."""
    existing = registered_policy_loss(POLICY_LOSS_NAME)
    if existing is not None and existing not in (troll_policy_loss_seam, troll_policy_loss_stock):
        raise RuntimeError(
            f"verl's policy-loss registry already has {POLICY_LOSS_NAME!r} ({existing.__module__}."
            f"{existing.__qualname__}); verl would silently overwrite it. Uninstall the other plugin."
        )
    # the core's fast paths: the kernels decline every call they do not serve (troll_verl.kernels); the core's
    # variants: the ablations' solver, tail and old-side estimates (troll_verl.ablations)
    importlib.import_module("troll_verl.kernels")
    importlib.import_module("troll_verl.ablations")
    if seam.route() == seam.SEAM:
        spec = troll_policy_loss_spec(core_algos)
        core_algos.register_policy_loss(POLICY_LOSS_NAME, spec=spec)(troll_policy_loss_seam)
    else:
        core_algos.register_policy_loss(POLICY_LOSS_NAME)(troll_policy_loss_stock)


_WORKERS_MODULE = "troll_verl.integration.workers"


def _install_worker_classes(engine_workers) -> None:
    """verl's actor worker module loaded: set it to build TROLL's training workers
    (:func:`troll_verl.integration.workers.install_worker_classes`). Where TROLL's workers module is the one importing
    verl's right now (a Ray worker unpickling one of TROLL's classes first), it installs them itself once complete."""
    workers = sys.modules.get(_WORKERS_MODULE)
    if workers is not None and not hasattr(workers, "install_worker_classes"):
        return
    importlib.import_module(_WORKERS_MODULE).install_worker_classes(engine_workers)


def _register_cpu_engines(_engine_package) -> None:
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from troll_verl.platform.value_model import make_cpu_value_engine_cls

    # the critic's engine: verl's, but loading the value model with the config's attention (see value_model.py)
    value_engine = make_cpu_value_engine_cls()
    for model_type, cls in (("language_model", FSDPEngineWithLMHead), ("value_model", value_engine)):
        for backend in ("fsdp", "fsdp2"):
            taken = engine_registry_entry(model_type, backend, "cpu")
            if taken is not None and taken is not cls:
                raise RuntimeError(
                    f"verl's engine registry already maps ({model_type}, {backend}, cpu) to {taken.__name__}; "
                    "troll-verl's CPU platform cannot register verl's FSDP engine there."
                )
            if taken is None:
                EngineRegistry.register(model_type=model_type, backend=backend, device="cpu")(cls)


def load_vllm_replica():
    """The plugin's replica for rollout ``vllm``: verl's (on the CPU platform the CPU platform's, whose refit works
    there: :mod:`troll_verl.platform.vllm_cpu`), with servers that return each generated token's top-K where bypass
    mode's rollout config asks for it (``rollout.custom.troll_topk``) and behave exactly as verl's otherwise
    (:mod:`troll_verl.bypass.vllm_replica`). verl calls it where it builds a replica (it imports vLLM)."""
    from troll_verl.bypass.vllm_replica import TopKCPUvLLMReplica, TopKvLLMReplica
    from troll_verl.platform.cpu import cpu_platform_requested

    return TopKCPUvLLMReplica if cpu_platform_requested() else TopKvLLMReplica


def _register_vllm_replica(replica_module) -> None:
    # Replaces verl's loader for "vllm" (keeping the name keeps every rollout.name == "vllm" branch of verl)
    existing = rollout_replica_loader(VLLM_ROLLOUT_NAME)
    if existing is not None and existing is not load_vllm_replica and not is_verls_rollout_loader(existing):
        raise RuntimeError(
            f"verl's rollout registry maps {VLLM_ROLLOUT_NAME!r} to {existing!r}, not verl's own vLLM replica; "
            "troll-verl cannot install its vLLM replica (bypass mode's top-K, the CPU platform's refit) there. "
            "Uninstall the other plugin."
        )
    replica_module.RolloutReplicaRegistry.register(VLLM_ROLLOUT_NAME, load_vllm_replica)


VERLS_SERVER_ADAPTER = "verl.workers.rollout.vllm_rollout.ServerAdapter"
CPU_SERVER_ADAPTER = "troll_verl.platform.vllm_cpu.CPUServerAdapter"


def _register_cpu_server_adapter(_base_module) -> None:
    # the sender of the CPU refit, naming its socket as CPUvLLMHttpServer's engine does (platform/vllm_cpu.py)
    existing = rollout_class_path(VLLM_ROLLOUT_NAME, "async")
    if existing not in (None, VERLS_SERVER_ADAPTER, CPU_SERVER_ADAPTER):
        raise RuntimeError(
            f"verl's rollout registry maps ({VLLM_ROLLOUT_NAME!r}, 'async') to {existing!r}, not verl's own "
            "ServerAdapter; troll-verl's CPU platform cannot install its refit sender there. Uninstall the other "
            "plugin."
        )
    set_rollout_class_path(VLLM_ROLLOUT_NAME, "async", CPU_SERVER_ADAPTER)


def _register_cpu_platform() -> None:
    from verl.plugin.platform import PlatformRegistry

    from troll_verl.platform.cpu import CPU_PLATFORM_NAME, make_platform_cls

    platform_cls = make_platform_cls()  # one class per process: the registry holds it or holds something else
    if PlatformRegistry.get(CPU_PLATFORM_NAME) is not platform_cls:
        PlatformRegistry.register(CPU_PLATFORM_NAME)(platform_cls)
    when_imported("verl.workers.engine", _register_cpu_engines)
    when_imported("verl.workers.rollout.base", _register_cpu_server_adapter)


_AGENT_LOOP_MODULE = "troll_verl.rollout.agent_loop"


def _load_agent_loop(_single_turn_module) -> None:
    # verl's single-turn loop loaded: load TROLL's subclass, which registers itself with verl's decorator as verl's own
    # loops do (at the end of its module, so also where it is the module importing verl's right now)
    if _AGENT_LOOP_MODULE not in sys.modules:
        importlib.import_module(_AGENT_LOOP_MODULE)


_REGISTERED = False


def register() -> None:
    """Register TROLL with verl (idempotent). Raises :class:`VerlVersionError` on an unsupported verl."""
    global _REGISTERED
    if _REGISTERED:
        return
    check_verl_capabilities()
    from troll_verl.platform.cpu import cpu_platform_requested

    when_imported("verl.trainer.ppo.core_algos", _register_policy_loss)
    when_imported("verl.workers.engine_workers", _install_worker_classes)
    when_imported("verl.workers.rollout.replica", _register_vllm_replica)
    when_imported("verl.experimental.agent_loop.single_turn_agent_loop", _load_agent_loop)
    if cpu_platform_requested():
        _register_cpu_platform()
    _REGISTERED = True


try:
    register()
except VerlVersionError as _e:
    # verl logs plugin failures at DEBUG only; say it where people look.
    logger.error("%s", _e)
    raise
