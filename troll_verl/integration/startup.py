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
"""Start-up checks: ``python -m troll_verl.main`` runs them before Ray starts and TROLL's workers at init
(:func:`check_plugin_active`, :func:`check_attention`, :func:`check_worker_start`,
:func:`check_training_worker_start`). Each refuses, naming the node and the fix, what would otherwise fail later and
further from its cause: a process where verl would not load troll-verl's plugin, and an attention implementation
whose package cannot be imported. :func:`route_troll_logs` keeps TROLL's warnings visible in a worker process.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import socket
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from .checks import troll_requested

__all__ = [
    "plugin_problem",
    "check_plugin_active",
    "check_attention",
    "check_worker_start",
    "check_training_worker_start",
    "route_troll_logs",
]

logger = logging.getLogger(__name__)

# verl's log-line format (verl.utils.logging_utils) with the logger's name added
_LOG_FORMAT = "%(levelname)s:%(asctime)s:%(name)s: %(message)s"

# troll-verl's entry point in verl's plugin group (pyproject.toml) and the module it names
PLUGIN_GROUP = "verl.plugins"
PLUGIN_ENTRY_POINT = "troll"
PLUGIN_MODULE = "troll_verl.integration.plugin"
_CLUSTER_DOCS = "docs/install.md#clusters"

FLASH_ATTENTION_2 = "flash_attention_2"
# attention implementations that need a package of their own: the packages that provide it (import names). Without
# flash_attn, transformers falls back to the hub kernel kernels-community/flash-attn2 where the `kernels` package is
# installed (transformers' PreTrainedModel._check_and_adjust_attn_implementation).
_ATTENTION_PACKAGES = {FLASH_ATTENTION_2: ("flash_attn", "kernels")}
_MISSING = "neither flash_attn nor kernels (transformers' hub-kernel fallback) is importable"
# strategies whose engine loads the model through transformers with its attn_implementation (verl's Megatron engine
# builds attention with Megatron-Core instead)
_HF_ATTENTION_STRATEGIES = ("fsdp", "fsdp2")
_FLASH_ATTN_INSTALL = "troll-verl's gpu extra, verl[vllm,fsdp]==0.9.1 with its flash-attn 2.8.3 (docs/install.md)"


def _node() -> str:
    """This machine's host name and, in a Ray worker, its node's IP address."""
    host = socket.gethostname()
    ray = sys.modules.get("ray")  # never imported here only to name the node
    try:
        if ray is not None and ray.is_initialized():
            return f"{host} ({ray.util.get_node_ip_address()})"
    except Exception:  # naming the node must never hide the error it is part of
        pass
    return host


def _entry_point_targets() -> list[str]:
    """The modules that this Python environment's ``troll`` entry points of verl's plugin group name."""
    return [ep.value for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_ENTRY_POINT]


def plugin_problem(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """Why ``import verl`` would not load troll-verl's plugin in a process with environment ``environ`` (default:
    this process's) on this Python environment, as ``(reason, fix)``; None where it would.

    Mirrors verl's loading at the end of ``import verl`` (``verl/__init__.py``): the modules named in
    ``VERL_USE_EXTERNAL_MODULES``, then every entry point of the group ``verl.plugins`` unless
    ``VERL_USE_EXTERNAL_PLUGINS`` is ``none`` or a list of names without ``troll`` (``auto``, the default, loads all).
    """
    env = os.environ if environ is None else environ
    modules = {name.strip() for name in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",")}
    if PLUGIN_MODULE in modules:
        return None
    raw = env.get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip()
    if raw.lower() == "none":
        return (
            "VERL_USE_EXTERNAL_PLUGINS=none switches verl's plugin loading off",
            "unset VERL_USE_EXTERNAL_PLUGINS (or set it to auto) where it is set (the job's environment, the node's "
            "`ray start` environment, ray_kwargs.ray_init.runtime_env.env_vars), or also set "
            f"VERL_USE_EXTERNAL_MODULES={PLUGIN_MODULE}",
        )
    if raw.lower() != "auto":
        allowed = sorted({name.strip() for name in raw.lower().split(",") if name.strip()})
        if PLUGIN_ENTRY_POINT not in allowed:
            return (
                f"VERL_USE_EXTERNAL_PLUGINS={raw} lets verl load only {allowed}, not '{PLUGIN_ENTRY_POINT}'",
                f"add it: VERL_USE_EXTERNAL_PLUGINS={raw},{PLUGIN_ENTRY_POINT} (or unset the variable)",
            )
    targets = _entry_point_targets()
    if not targets:
        code = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return (
            f"the Python environment {sys.prefix} has no '{PLUGIN_ENTRY_POINT}' entry point in verl's "
            f"'{PLUGIN_GROUP}' group: troll-verl is not installed there (its code at {code} is importable, e.g. "
            "through PYTHONPATH or Ray's working_dir, but that registers nothing)",
            "install troll-verl into the Python that runs verl on this node (from a checkout: pip install -e .; or "
            f"its wheel), or set VERL_USE_EXTERNAL_MODULES={PLUGIN_MODULE} for the job",
        )
    if PLUGIN_MODULE not in targets:
        return (
            f"this Python environment's '{PLUGIN_ENTRY_POINT}' entry point in '{PLUGIN_GROUP}' names {targets}, not "
            f"{PLUGIN_MODULE}: another package claims the name",
            "uninstall the other package",
        )
    return None


def _plugin_refusal(asked: str, process: str, problem: tuple[str, str]) -> RuntimeError:
    reason, fix = problem
    return RuntimeError(
        f"This run asks for TROLL ({asked}), but troll-verl's verl plugin is not active in {process} on node "
        f"{_node()}: {reason}. Fix: {fix}. On a Ray cluster troll-verl must be installed on every node, or shipped "
        f"in the job's runtime environment ({_CLUSTER_DOCS})."
    )


def check_plugin_active(config) -> None:
    """Before Ray starts: where ``config`` (a full verl config) asks for TROLL, refuse when ``import verl`` in the run's
    processes would not load troll-verl's plugin (:func:`plugin_problem`), naming this node and the fix.

    The run's processes see this process's environment plus ``ray_kwargs.ray_init.runtime_env.env_vars``; this
    node's Python environment stands in for the other nodes' (each TROLL worker checks its own at init:
    :func:`check_worker_start`).

    Raises:
        RuntimeError: naming the node, the reason and the fix.
    """
    if not troll_requested(config):
        return
    from omegaconf import OmegaConf

    env_vars = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars", default=None) or {}
    environ = {**os.environ, **{str(key): str(value) for key, value in env_vars.items()}}
    problem = plugin_problem(environ)
    if problem is not None:
        loss_mode = OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss.loss_mode", default=None)
        raise _plugin_refusal(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}", "the driver", problem)


def _import_plugin() -> None:
    importlib.import_module(PLUGIN_MODULE)


def _check_plugin_loaded(process: str) -> None:
    """In a process of the run (TROLL's workers): refuse unless verl loaded troll-verl's plugin here."""
    if PLUGIN_MODULE in sys.modules:  # imported (a failed import leaves no entry), so registered
        return
    problem = plugin_problem()
    if problem is None:  # verl would load it: loading it failed, or verl has not run its loading yet
        try:
            _import_plugin()
            return
        except Exception as exc:
            problem = (
                f"importing {PLUGIN_MODULE} fails ({type(exc).__name__}: {exc}); verl logs that at DEBUG only",
                "fix that error in this node's Python environment",
            )
    raise _plugin_refusal("TROLL's worker started in this process", process, problem)


def _select(node: Any, path: str) -> Any:
    """``path`` (dotted) in a DictConfig, mapping or dataclass; None where any part is missing."""
    for part in path.split("."):
        if node is None:
            return None
        node = node.get(part) if isinstance(node, Mapping) or hasattr(node, "keys") else getattr(node, part, None)
    return node


def _importable(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _attention_refusal(
    model_key: str, strategies, override_config, *, critic: bool, cpu: bool, importable
) -> str | None:
    """Why verl's engine cannot load the model configured under ``model_key`` (``actor_rollout_ref.model``: the actor
    and the reference; ``critic.model``) with its attention implementation, naming the fix; None where it can.

    Reads the key verl reads, ``<model_key>.override_config.attn_implementation`` (verl's ``HFModelConfig``, default
    ``flash_attention_2``). ``importable(package)`` says whether a package can be imported where the model loads.
    """
    if not any(strategy in _HF_ATTENTION_STRATEGIES for strategy in strategies):
        return None
    override_config = override_config or {}
    key = f"{model_key}.override_config.attn_implementation"
    set_key = f"{key}=sdpa" if "attn_implementation" in override_config else f"+{key}=sdpa"
    configured = str(override_config.get("attn_implementation", FLASH_ATTENTION_2))
    if cpu:  # the CPU platform loads the critic with the config's attention too (troll_verl/platform/value_model.py)
        if "flash" in configured:
            return f"On the CPU platform flash attention cannot run: set {set_key} (got {configured})."
        return None
    # NOTE: verl 0.9.1 loads a critic with attn_implementation="flash_attention_2" written into the call
    # (verl.utils.model.load_valuehead_model), whatever the config says.
    attention = FLASH_ATTENTION_2 if critic else configured
    packages = _ATTENTION_PACKAGES.get(attention)
    if packages is None or any(importable(package) for package in packages):
        return None
    where = f"the Python that loads the model on node {_node()}"
    if critic:
        return (
            f"verl 0.9.1 loads PPO's critic with attn_implementation={FLASH_ATTENTION_2} whatever {key} says "
            f"(verl.utils.model.load_valuehead_model), and {_MISSING} in {where}; setting it to sdpa "
            f"is no fix for the critic. Install flash-attn on every GPU node: {_FLASH_ATTN_INSTALL}."
        )
    source = f"{key}={configured}" if "attn_implementation" in override_config else f"verl's default, {key} unset"
    return (
        f"The actor (and the reference) load with attn_implementation={configured} ({source}), which needs the "
        f"flash_attn package, and {_MISSING} in {where}. Install flash-attn on every GPU node "
        f"({_FLASH_ATTN_INSTALL}), or set {set_key} (PyTorch's attention, no extra package; keep Ulysses sequence "
        "parallelism at 1 then: verl's Ulysses patch wraps flash attention only)."
    )


def check_attention(config, *, local: bool = True) -> list[str]:
    """Before Ray starts: refuse a run whose actor, reference or critic cannot load with its attention implementation
    (``flash_attention_2``, verl's default, without an importable ``flash_attn`` or ``kernels``; flash attention on the
    CPU platform), naming the fix.

    Args:
        config: a full verl config.
        local: False for a dry run, which validates a run meant for other machines: a package missing *here* is then
            returned as a warning (and logged) instead of refused.

    Returns:
        The warnings (only with ``local=False``).

    Raises:
        ValueError: naming the key to set or the package to install.
    """
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    from troll_verl.platform.cpu import cpu_platform_requested

    roles = ("actor", "ref") if need_reference_policy(config) else ("actor",)
    models = [("actor_rollout_ref.model", [OmegaConf.select(config, f"actor_rollout_ref.{r}.strategy") for r in roles])]
    with warnings.catch_warnings():  # verl warns when it infers "no critic"; prepare() has let it speak once
        warnings.simplefilter("ignore")
        critic = need_critic(config)
    if critic:
        models.append(("critic.model", [OmegaConf.select(config, "critic.strategy")]))
    found = []
    for model_key, strategies in models:
        refusal = functools.partial(
            _attention_refusal, model_key, strategies, OmegaConf.select(config, f"{model_key}.override_config"),
            critic=model_key == "critic.model", cpu=cpu_platform_requested(),
        )  # fmt: skip
        problem = refusal(importable=_importable if local else lambda _: True)
        if problem is not None:
            raise ValueError(problem)
        missing_here = None if local else refusal(importable=_importable)
        if missing_here is not None:
            logger.warning("Dry run: this machine lacks what the run needs where the model loads: %s", missing_here)
            found.append(missing_here)
    return found


def check_worker_start(config, role: str) -> None:
    """TROLL's actor worker at init: the plugin is active in this process and the model's attention can load here.

    Args:
        config: verl's ``actor_rollout_ref`` section, as the worker receives it.
        role: the worker's role (``actor``, ``rollout``, ``ref``, ``actor_rollout``, ``actor_rollout_ref``).

    Raises:
        RuntimeError: the plugin is not active (naming the node and the fix).
        ValueError: the attention implementation cannot load (naming the key or the package).
    """
    from troll_verl.platform.cpu import cpu_platform_requested

    _check_plugin_loaded(f"the {role} worker")
    strategies = [_select(config, f"{part}.strategy") for part in ("actor", "ref") if part in role]
    refusal = _attention_refusal(
        "actor_rollout_ref.model", strategies, _select(config, "model.override_config"), critic=False,
        cpu=cpu_platform_requested(), importable=_importable,
    )  # fmt: skip
    if refusal is not None:
        raise ValueError(refusal)


def check_training_worker_start(config) -> None:
    """TROLL's ``TrainingWorker`` (the actor's, the reference's, PPO's critic) at init: as :func:`check_worker_start`,
    for the model it trains or evaluates.

    Args:
        config: verl's ``TrainingWorkerConfig`` (``model_type``, ``model_config``, ``engine_config``).
    """
    from troll_verl.platform.cpu import cpu_platform_requested

    model_type = _select(config, "model_type")
    _check_plugin_loaded(f"the {model_type} worker")
    critic = model_type == "value_model"
    refusal = _attention_refusal(
        "critic.model" if critic else "actor_rollout_ref.model", [_select(config, "engine_config.strategy")],
        _select(config, "model_config.override_config"), critic=critic, cpu=cpu_platform_requested(),
        importable=_importable,
    )  # fmt: skip
    if refusal is not None:
        raise ValueError(refusal)


class _DroppedByRoot(logging.Filter):
    """Passes a record only where no handler of the root logger would emit it (see :func:`route_troll_logs`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(record.levelno >= handler.level for handler in logging.getLogger().handlers)


def route_troll_logs() -> None:
    """Make sure the ``troll_verl`` loggers' warnings reach stderr in a worker process, whatever the root logger says.

    NOTE: verl's worker processes import verl's vLLM server, which imports vLLM's OpenAI server, which imports
    ``model_hosting_container_standards``: that package sets the root logger and every root handler to ERROR (unless
    ``SAGEMAKER_CONTAINER_LOG_LEVEL`` or ``LOG_LEVEL`` is set), so TROLL's warnings there (``troll/mismatch_kl``
    above ``kl_bound``, a missed old top-K) were dropped. The ``troll_verl`` logger gets its level (WARNING, where
    unset) and a stderr handler that emits only the records no root handler would; they still propagate, so nothing
    is printed twice and a root handler (pytest's, Hydra's) still sees them. Calling it again changes nothing.
    """
    package = logging.getLogger("troll_verl")
    if package.level == logging.NOTSET:
        package.setLevel(logging.WARNING)
    if any(isinstance(kept, _DroppedByRoot) for existing in package.handlers for kept in existing.filters):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    handler.addFilter(_DroppedByRoot())
    package.addHandler(handler)
