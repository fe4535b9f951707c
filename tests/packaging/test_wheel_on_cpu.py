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
"""The wheel and sdist users install: built, installed into fresh environments beside verl, and used there.

Offline and without downloading verl or torch again:

- The build is ``python -m build --no-isolation``'s: pyproject.toml's build backend (setuptools) called through its
  PEP 517 hooks, in this interpreter (whose setuptools must satisfy ``build-system.requires``), on a copy of the
  checkout's files (git's tracked and untracked-but-not-ignored ones), so the checkout gets no build/ or egg-info.
- Each environment is ``python -m venv --without-pip``, with this venv's site-packages visible through a folder of
  links to everything in it except the editable troll-verl (its dist-info, its ``__editable__`` .pth and finder), so
  ``import troll_verl`` can only find what was installed. This venv's pip installs into it (``--target``, no index,
  no dependencies, no pip configuration).
- There: the ``verl.plugins`` entry point names troll; ``import verl`` and ``get_policy_loss_fn("troll")`` give
  TROLL's loss; ``python -m troll_verl.main --help`` composes the packaged config; the config is a package resource;
  ``troll_verl`` comes from the environment; ``troll_verl.testing`` is not shipped (pyproject.toml says why), while
  the editable install still provides it from the checkout.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from troll_verl.testing import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the copy setuptools carries
    from setuptools.compat.py310 import tomllib

# about 20 s on 2 cores, in several processes: the builds, pip, two environments importing verl and running the CLI
pytestmark = pytest.mark.slow

NAME = "troll_verl"
SDIST_ROOT = "troll_verl-{version}"
# what runs in an environment: the answers the test checks
CHECK = textwrap.dedent(
    """\
    import importlib.metadata as md, importlib.resources as resources, json
    out = {"entry_points": [[ep.name, ep.value, ep.dist.name] for ep in md.entry_points(group="verl.plugins")]}
    import verl
    from verl.trainer.ppo import core_algos
    loss = core_algos.get_policy_loss_fn("troll")
    out["loss"] = f"{loss.__module__}.{loss.__qualname__}"
    import troll_verl
    out["file"] = troll_verl.__file__
    out["config"] = (resources.files("troll_verl") / "config/troll_trainer.yaml").is_file()
    try:
        import troll_verl.testing
        out["testing"] = troll_verl.testing.__file__
    except ImportError:
        out["testing"] = None
    print("CHECK " + json.dumps(out))
    """
)


def _source_copy(dst: Path) -> Path:
    """The checkout's files (tracked, and untracked but not ignored) copied to ``dst``."""
    proc = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    for rel in filter(None, proc.stdout.split("\0")):
        src = Path(REPO, rel)
        if src.is_file():  # a tracked file another change deleted is not there
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def _build(src: Path, out: Path, *hooks: str) -> list[Path]:
    """``python -m build --no-isolation``: the backend's PEP 517 hooks, run in ``src`` by this interpreter."""
    system = tomllib.loads((src / "pyproject.toml").read_text())["build-system"]
    for spec in system["requires"]:  # --no-isolation builds with what this interpreter has
        req = Requirement(spec)
        try:
            have = version(req.name)
        except PackageNotFoundError:
            have = None
        assert have is not None and req.specifier.contains(have, prereleases=True), (
            f"the build needs {spec}, this venv has {req.name} {have}: pip install '{spec}' (or python -m build "
            "with network, which fetches it)"
        )
    out.mkdir(parents=True, exist_ok=True)
    # (the hooks rewrite sys.argv: read the folder first)
    code = f"import importlib, sys; out = sys.argv[1]; b = importlib.import_module({system['build-backend']!r})\n"
    code += "".join(f"print('BUILT', b.{hook}(out))\n" for hook in hooks)
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [out / line.split()[1] for line in proc.stdout.splitlines() if line.startswith("BUILT ")]


def _is_troll(name: str) -> bool:
    return name.startswith((NAME, f"__editable__.{NAME}", f"__editable___{NAME}"))


def _fresh_env(root: Path) -> tuple[Path, Path]:
    """A venv without pip that sees this venv's packages, minus troll-verl; returns (its python, its site-packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    main_site = Path(sysconfig.get_path("purelib"))
    links = root / "main-site-packages"
    links.mkdir()
    for entry in main_site.iterdir():
        if _is_troll(entry.name) or entry.name == "__pycache__":
            continue
        # .pth files only run from a site directory: link them there; everything else is reached through `links`
        (site / entry.name if entry.suffix == ".pth" else links / entry.name).symlink_to(entry)
    (site / "zz_main_venv.pth").write_text(f"{links}\n")
    return python, site


def _pip_install(site: Path, *args: str) -> None:
    """This venv's pip installs into another environment's site-packages: no index, no deps, no pip configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--target",
        str(site),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**env, "PIP_CONFIG_FILE": os.devnull})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _run(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(
        [python, *args], cwd=cwd, capture_output=True, text=True, env={**env, "PYTHONNOUSERSITE": "1"}
    )


def _check_installed(python: Path, root: Path) -> None:
    proc = _run(python, root, "-c", CHECK)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.split("CHECK ", 1)[1])
    assert got["entry_points"] == [["troll", "troll_verl.integration.plugin", "troll-verl"]], got
    assert got["loss"] == "troll_verl.integration.plugin.troll_policy_loss_stock", got
    assert Path(got["file"]).resolve().is_relative_to(root.resolve()), got  # not /work/main, not the editable one
    assert got["config"] and got["testing"] is None, got
    proc = _run(python, root, "-m", "troll_verl.main", "--help")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "loss_mode: troll" in proc.stdout  # troll_trainer.yaml composed over verl's ppo_trainer


def _package_files(names, prefix: str = "") -> set[str]:
    """The package's files among archive member names (``prefix`` stripped), bytecode left out."""
    return {
        n.removeprefix(prefix)
        for n in names
        if n.removeprefix(prefix).startswith(f"{NAME}/") and not n.endswith("/") and "__pycache__" not in n
    }


def _wheel_contents(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_wheel_and_sdist_install_beside_verl(tmp_path):
    src = _source_copy(tmp_path / "src")
    sdist, wheel = _build(src, tmp_path / "dist", "build_sdist", "build_wheel")
    assert wheel.name.endswith("-py3-none-any.whl") and sdist.name.endswith(".tar.gz")

    # every file of the package in the checkout, but the test support, is in the wheel and the sdist: the Python
    # modules by packages.find, the rest by package-data (a new data file fails here until pyproject.toml lists it)
    expected = {
        p.relative_to(src).as_posix()
        for p in (src / NAME).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    expected = {p for p in expected if not p.startswith(f"{NAME}/testing/")}
    assert f"{NAME}/config/troll_trainer.yaml" in expected
    wheel_files = _wheel_contents(wheel)
    assert _package_files(wheel_files) == expected
    entry_points = next(v for k, v in wheel_files.items() if k.endswith(".dist-info/entry_points.txt")).decode()
    assert "[verl.plugins]\ntroll = troll_verl.integration.plugin" in entry_points
    with tarfile.open(sdist) as tf:
        members = [m.name for m in tf.getmembers() if m.isfile()]
    root = SDIST_ROOT.format(version=wheel.name.split("-")[1]) + "/"
    assert {f"{root}pyproject.toml", f"{root}PKG-INFO", f"{root}README.md"} <= set(members)
    assert _package_files(members, root) == expected

    # the sdist builds the same wheel
    unpacked = tmp_path / "unpacked"
    with tarfile.open(sdist) as tf:
        tf.extractall(unpacked, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    [rebuilt] = _build(unpacked / root, tmp_path / "dist-from-sdist", "build_wheel")
    assert rebuilt.name == wheel.name
    assert _wheel_contents(rebuilt) == wheel_files

    # installed, each into its own fresh environment beside this venv's verl and torch
    for kind, artifact, extra in (("wheel", wheel, ()), ("sdist", sdist, ("--no-build-isolation",))):
        env_root = tmp_path / f"env-{kind}"
        python, site = _fresh_env(env_root)
        assert _run(python, env_root, "-c", "import troll_verl").returncode != 0  # nothing leaks in from the checkout
        _pip_install(site, *extra, str(artifact))
        _check_installed(python, env_root)


def test_the_editable_install_still_provides_the_test_support(tmp_path):
    """troll_verl.testing is left out of the wheel, not out of the checkout's editable install (tests use it)."""
    src = _source_copy(tmp_path / "src")
    [editable] = _build(src, tmp_path / "dist", "build_editable")
    root = tmp_path / "env"
    python, site = _fresh_env(root)
    _pip_install(site, str(editable))
    proc = _run(python, root, "-c", "import troll_verl.testing as t; print(t.__file__)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path(proc.stdout.strip()) == src / NAME / "testing" / "__init__.py"
