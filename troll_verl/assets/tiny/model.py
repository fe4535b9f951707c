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
"""The built-in tiny Qwen2 model and its supervised warm-up on the task format.

RL fine-tunes pretrained LMs; starting from noise would make the CPU run unlike real use (and slow). So the model
first gets a short supervised warm-up on chat-formatted training problems: a few seconds on 2 cores, stopped
early on purpose so that the policy knows the format and is right only sometimes. RL then has something to
improve.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .task import answer_text, prompt_text

__all__ = ["tiny_qwen2_config", "build_model", "encode_example", "warm_up", "generate"]


def tiny_qwen2_config(vocab_size: int, *, eos_token_id: int, pad_token_id: int, max_positions: int = 128):
    """A 2-layer Qwen2 (hidden 64, 2 heads of dimension 32, tied embeddings): ~0.1 M parameters, fp32.

    The head dimension is one vLLM's CPU attention kernel supports (32, 64, 80, ...; 16 is refused).
    """
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )


def build_model(config, seed: int):
    """A freshly initialised tiny Qwen2 causal LM for the built-in tokenizer (seeded, fp32)."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).float()


def encode_example(tokenizer, a: int, b: int) -> tuple[list[int], int]:
    """(prompt + answer + ``<|im_end|>`` ids, prompt length), with the chat template the agent loop applies."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt_text(a, b)}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    answer = tokenizer.encode(answer_text(a, b), add_special_tokens=False) + [tokenizer.eos_token_id]
    return list(prompt) + answer, len(prompt)


def warm_up(
    model,
    tokenizer,
    pairs: list[tuple[int, int]],
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Supervised warm-up: next-token loss on the answer tokens of random training problems (AdamW).

    Returns:
        ``{"steps", "final_loss", "seconds"}``.
    """
    generator = torch.Generator().manual_seed(seed)
    examples = [encode_example(tokenizer, a, b) for a, b in pairs]
    pad = tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    start, loss_value = time.perf_counter(), float("nan")
    for step in range(steps):
        picks = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
        batch = [examples[i] for i in picks]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((batch_size, width), pad, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        attention_mask = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (ids, prompt_len) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
            attention_mask[row, : len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        if log is not None and (step + 1) % 50 == 0:
            log(f"warm-up step {step + 1}/{steps}: loss {loss_value:.3f}")
    model.eval()
    return {"steps": steps, "final_loss": loss_value, "seconds": time.perf_counter() - start}


@torch.no_grad()
def generate(model, prompts: list[list[int]], *, pad_token_id: int, eos_token_id: int, max_new_tokens: int,
             temperature: float = 0.0, seed: int = 0) -> list[list[int]]:  # fmt: skip
    """Generated token ids per prompt (EOS included when produced), with ``transformers``' ``generate``.

    Greedy at ``temperature=0``, else sampling from ``softmax(logits / temperature)`` with no top-k/top-p.
    Prompts are left-padded into one batch.
    """
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    torch.manual_seed(seed)
    sampling = dict(temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else {}
    out = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
        eos_token_id=eos_token_id, do_sample=temperature > 0, **sampling,
    )  # fmt: skip
    result = []
    for row in out[:, width:].tolist():
        ids = []
        for token in row:
            ids.append(token)
            if token == eos_token_id:
                break
        result.append(ids)
    return result
