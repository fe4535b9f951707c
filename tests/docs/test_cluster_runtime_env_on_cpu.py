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
"""The runtime-environment fragments docs/install.md gives for clusters (``ray job submit --runtime-env``), read from
the page: each is valid for Ray's own ``RuntimeEnv`` (no cluster is started), keeps TROLL's plugin active in every
process of the job even where the cluster switches verl's plugin loading off, and merges with the runtime
environment verl passes to ``ray.init`` (Ray refuses the same environment variable in both)."""

import re
import textwrap
from pathlib import Path

import pytest
import yaml

import troll_verl
from troll_verl.integration import startup

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "install.md"


def _fragments() -> dict[str, dict]:
    """The page's yaml blocks that start with ``# runtime_env: <name>``, by name."""
    found = {}
    for _indent, body in re.findall(r"^( *)```yaml\n(.*?)^\1```", DOC.read_text(), re.M | re.S):
        body = textwrap.dedent(body)
        match = re.match(r"# runtime_env: (\w+)", body)
        if match:
            found[match.group(1)] = yaml.safe_load(body)
    return found


FRAGMENTS = _fragments()
# what a cluster may have set on its nodes: verl's plugin loading off
CLUSTER_ENV = {"VERL_USE_EXTERNAL_PLUGINS": "none"}


def test_the_page_gives_both_routes():
    assert set(FRAGMENTS) == {"wheel", "checkout"}


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
def test_each_fragment_is_a_valid_ray_runtime_env(name, monkeypatch):
    from ray.runtime_env import RuntimeEnv

    monkeypatch.chdir(ROOT)  # the checkout route ships troll_verl/ from the repository root
    env = RuntimeEnv(**FRAGMENTS[name])
    assert set(env.to_dict()) >= set(FRAGMENTS[name])


def test_the_wheel_route_ships_this_checkouts_wheel():
    pip = FRAGMENTS["wheel"]["pip"]
    (wheel,) = pip["packages"]
    assert Path(wheel).name == f"troll_verl-{troll_verl.__version__}-py3-none-any.whl"  # pip wheel --no-deps's name
    # installed from the wheel, the plugin's entry point exists on every node; the job's variable wins over the node's
    assert startup.plugin_problem({**CLUSTER_ENV, **FRAGMENTS["wheel"]["env_vars"]}) is None
    assert startup.plugin_problem(CLUSTER_ENV) is not None


def test_the_checkout_route_names_the_plugin_module(monkeypatch):
    """Without an installation the node has no entry point; VERL_USE_EXTERNAL_MODULES imports the plugin anyway."""
    fragment = FRAGMENTS["checkout"]
    assert fragment["py_modules"] == ["troll_verl"] and (ROOT / "troll_verl" / "integration" / "plugin.py").is_file()
    monkeypatch.setattr(startup, "_entry_point_targets", lambda: [])
    assert startup.plugin_problem({}) is not None
    assert startup.plugin_problem({**CLUSTER_ENV, **fragment["env_vars"]}) is None


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
def test_each_fragment_merges_with_verls_runtime_env(name, monkeypatch):
    from verl.trainer.constants_ppo import PPO_RAY_RUNTIME_ENV, get_ppo_ray_runtime_env

    for key in PPO_RAY_RUNTIME_ENV["env_vars"]:  # verl leaves out what the launching shell set: see all of it
        monkeypatch.delenv(key, raising=False)
    verls = get_ppo_ray_runtime_env()
    fragment = FRAGMENTS[name]
    assert not set(fragment.get("env_vars", {})) & set(verls["env_vars"])
    assert not (set(fragment) - {"env_vars"}) & (set(verls) - {"env_vars"})
