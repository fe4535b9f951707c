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
"""A byte-level Qwen2 tokenizer built in code: 256 byte tokens plus Qwen2's three ChatML specials.

It is a real ``Qwen2Tokenizer`` (saved with ``save_pretrained`` and reloaded by ``AutoTokenizer``), so it meets
what verl's agent loop expects of the ``qwen2`` family: ``"\\n"`` is one token, ``<|im_end|>`` ends a turn and is
the EOS, and the chat template is ChatML. With no merges, every byte is one token: tiny vocabulary, no
downloads.
"""

from __future__ import annotations

__all__ = ["build_tokenizer", "SPECIAL_TOKENS", "CHAT_TEMPLATE"]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML, as the Qwen2 family writes it (no default system prompt, to keep prompts short).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-unicode map (byte-level BPE's alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def build_tokenizer():
    """Return the byte-level ``Qwen2Tokenizer`` (ids: bytes 0–255, then ``<|endoftext|>``, ``<|im_start|>``,
    ``<|im_end|>``); pad is ``<|endoftext|>``, EOS is ``<|im_end|>``."""
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    for offset, token in enumerate(SPECIAL_TOKENS):
        vocab[token] = 256 + offset
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
