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
"""Build (once) and cache the tiny model, tokenizer and task data; no downloads.

``build_assets()`` returns :class:`~troll_verl.assets.common.Assets` with a ``transformers`` model directory
(warmed-up weights, the byte-level Qwen2 tokenizer, a generation config) and the train/validation parquet files.
The cache directory is keyed by a hash of everything that shapes the assets, so changing a setting builds a fresh
set and a finished set is reused as is. Builds write into a temporary directory that is renamed into place, so an
interrupted build never leaves a half-written cache behind.

CLI: ``python -m troll_verl.assets.tiny [--cache-dir DIR] [--force]`` prints the paths as JSON.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..common import Assets, build_cached, default_cache_dir, spec_key

__all__ = ["Assets", "TinySpec", "build_assets", "default_cache_dir"]

_ASSETS_VERSION = 2  # 2: head dimension 32 (vLLM's CPU attention)


@dataclass(frozen=True)
class TinySpec:
    """Everything that shapes the assets (part of the cache key)."""

    num_operands: int = 10
    val_fraction: float = 0.2
    split_seed: int = 0
    model_seed: int = 0
    warmup_steps: int = 130
    warmup_batch_size: int = 64
    warmup_lr: float = 3e-3

    def key(self) -> str:
        """The cache key of this model and task (changes whenever the asset would differ)."""
        return spec_key(_ASSETS_VERSION, self)


def build_assets(
    cache_dir: str | None = None,
    spec: TinySpec | None = None,
    *,
    force: bool = False,
    log: Callable[[str], None] | None = print,
) -> Assets:
    """Return the cached assets for ``spec``, building them first if needed (a few seconds on 2 cores)."""
    spec = spec or TinySpec()
    build = lambda out: _build_into(out, spec, log=log or (lambda _msg: None))  # noqa: E731
    return build_cached(cache_dir or default_cache_dir(), "tiny", spec.key(), build, force=force)


def _build_into(out: str, spec: TinySpec, log: Callable[[str], None]) -> dict:
    import pandas as pd
    import torch
    from transformers import GenerationConfig

    from .model import build_model, encode_example, generate, tiny_qwen2_config, warm_up
    from .task import DATA_SOURCE, AdditionTask, compute_score
    from .tokenizer import build_tokenizer

    start = time.perf_counter()
    task = AdditionTask(spec.num_operands, spec.val_fraction, spec.split_seed)
    train_pairs, val_pairs = task.split()
    os.makedirs(os.path.join(out, "data"))
    pd.DataFrame(task.rows(train_pairs, "train")).to_parquet(os.path.join(out, "data", "train.parquet"))
    pd.DataFrame(task.rows(val_pairs, "val")).to_parquet(os.path.join(out, "data", "val.parquet"))

    tokenizer = build_tokenizer()
    config = tiny_qwen2_config(len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    # One thread: the model's ops are too small to share between threads, and on a busy machine (the suite's other
    # pytest worker, a training run) every op of a two-thread build waits for a descheduled thread: beside a training
    # run on 2 cores the warm-up took 137 s on two threads and 6 s on one, to the same bits in that one measurement
    # (docs/benchmarks.md, "Threads").
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_model(config, spec.model_seed)
        log(f"[troll-verl tiny] warming up a {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M-parameter Qwen2 "
            f"on {len(train_pairs)} addition problems ({spec.warmup_steps} steps)")  # fmt: skip
        stats = warm_up(
            model, tokenizer, train_pairs, steps=spec.warmup_steps, batch_size=spec.warmup_batch_size,
            lr=spec.warmup_lr, seed=spec.model_seed, log=log,
        )  # fmt: skip

        def accuracy(pairs, temperature: float) -> float:
            prompts = [ids[:prompt_len] for ids, prompt_len in (encode_example(tokenizer, a, b) for a, b in pairs)]
            outs = generate(model, prompts, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                            max_new_tokens=8, temperature=temperature, seed=spec.model_seed)  # fmt: skip
            scores = [
                compute_score(DATA_SOURCE, tokenizer.decode(o), str(a + b))["score"]
                for o, (a, b) in zip(outs, pairs, strict=True)
            ]
            return sum(scores) / len(scores)

        model_dir = os.path.join(out, "model")
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(
            model_dir
        )
        info = {
            "spec": asdict(spec),
            "key": spec.key(),
            "num_train": len(train_pairs),
            "num_val": len(val_pairs),
            "parameters": sum(p.numel() for p in model.parameters()),
            "warmup": stats,
            "warmup_accuracy": {
                "train_greedy": accuracy(train_pairs, 0.0),
                "val_greedy": accuracy(val_pairs, 0.0),
                "train_sampled_t1": accuracy(train_pairs, 1.0),
            },
            "build_seconds": time.perf_counter() - start,
        }
    finally:
        torch.set_num_threads(threads)
    log(f"[troll-verl tiny] warm-up done in {stats['seconds']:.1f} s: accuracy {info['warmup_accuracy']}")
    return info
