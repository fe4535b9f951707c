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
"""What the two CPU assets share: the cached, atomically built asset folder, its cache key, and the addition task's
split and verl rows (the tasks differ only in their prompt, answer format and scorer)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass

__all__ = ["Assets", "default_cache_dir", "spec_key", "cached_assets", "build_cached", "addition_split",
           "addition_rows"]  # fmt: skip


@dataclass(frozen=True)
class Assets:
    """A built model and its task's data: root/model, root/data/{train,val}.parquet, root/assets.json."""

    root: str
    model_dir: str
    train_file: str
    val_file: str
    info: dict

    def as_dict(self) -> dict:
        """The asset's paths and info as a JSON-ready dict (what the asset CLIs print)."""
        return {"root": self.root, "model_dir": self.model_dir, "train_file": self.train_file,
                "val_file": self.val_file, "info": self.info}  # fmt: skip


def default_cache_dir() -> str:
    """``$TROLL_VERL_CACHE`` or ``~/.cache/troll_verl``."""
    return os.environ.get("TROLL_VERL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "troll_verl")


def spec_key(version: int, spec, **extra) -> str:
    """12 hex digits naming everything that shapes an asset: the builder's version, the spec's fields, ``extra``."""
    payload = json.dumps({"version": version, **extra, **asdict(spec)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _load(root: str) -> Assets:
    with open(os.path.join(root, "assets.json")) as f:
        info = json.load(f)
    data = os.path.join(root, "data")
    return Assets(root, os.path.join(root, "model"), os.path.join(data, "train.parquet"),
                  os.path.join(data, "val.parquet"), info)  # fmt: skip


def cached_assets(cache_dir: str, name: str, key: str) -> Assets | None:
    """The finished asset ``cache_dir/<name>-<key>``, or None."""
    root = os.path.join(cache_dir, f"{name}-{key}")
    return _load(root) if os.path.exists(os.path.join(root, "assets.json")) else None


def build_cached(
    cache_dir: str, name: str, key: str, build_into: Callable[[str], dict], *, force: bool = False
) -> Assets:
    """The asset ``cache_dir/<name>-<key>``, built first by ``build_into(folder) -> info`` unless it is there.

    The build runs in a hidden temporary folder that is renamed into place only once ``assets.json`` is written, so
    an interrupted build leaves nothing that looks finished (and no partial folder); of two concurrent builds of the
    same asset, the first to finish wins.
    """
    found = cached_assets(cache_dir, name, key)
    if found is not None and not force:
        return found
    root = os.path.join(cache_dir, f"{name}-{key}")
    os.makedirs(cache_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-build-", dir=cache_dir)
    try:
        info = build_into(tmp)
        with open(os.path.join(tmp, "assets.json"), "w") as f:
            json.dump(info, f, indent=2)
        if os.path.exists(root):
            shutil.rmtree(root)
        try:
            os.rename(tmp, root)
        except OSError:  # another process finished the same build first
            if not os.path.exists(os.path.join(root, "assets.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _load(root)


def addition_split(operands: range, val_fraction: float, seed: int) -> tuple[list, list]:
    """All ordered pairs of ``operands``, shuffled by ``seed``; ``(train, validation)`` with the validation share."""
    pairs = [(a, b) for a in operands for b in operands]
    random.Random(seed).shuffle(pairs)
    num_val = max(1, round(len(pairs) * val_fraction))
    return pairs[num_val:], pairs[:num_val]


def addition_rows(pairs, split: str, data_source: str, prompt_text: Callable[[int, int], str]) -> list[dict]:
    """verl's RL parquet rows: ``data_source``, chat ``prompt``, ``ability``, ``reward_model`` (the sum),
    ``extra_info``."""
    return [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": prompt_text(a, b)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index, "a": a, "b": b},
        }
        for index, (a, b) in enumerate(pairs)
    ]
