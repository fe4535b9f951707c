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
"""Batched sampling from a ``transformers`` causal LM, with per-request sampling parameters (verl-free).

:func:`generate_batch` runs one batch of token-in/token-out requests through a KV-cached decode loop:

- prompts are left-padded into one batch (position ids from the attention mask, as ``model.generate`` does);
- every request keeps its own temperature, top-k, top-p, repetition penalty, token budget and stop rules;
- each step the logits are processed in ``transformers``' order — repetition penalty, temperature, top-k,
  top-p — and **one** ``torch.multinomial`` draw is made over the whole batch (finished rows included), which is
  exactly what ``model.generate(do_sample=True)`` does. So under the same seed and the same batch the tokens
  equal ``model.generate``'s;
- log-probs are the *processed* ones, ``log_softmax`` of the logits after temperature/top-k/top-p, at the chosen
  token (vLLM's ``logprobs_mode=processed_logprobs``, verl's default). With top-k/top-p off this is
  ``log_softmax(logits / T)``, the log-prob verl's actor recomputes. Greedy rows (``temperature == 0``) report
  ``log_softmax(logits)``.

Stop rules: an EOS token (the model's, unless ``ignore_eos``) or a ``stop_token_ids`` token ends a request and is
kept in its output (as vLLM does); a ``stop`` string ends it at the token that completes the string.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["SamplingParams", "SampleOutput", "generate_batch", "process_logits"]

# Keys of verl's/vLLM's sampling-params dict that change nothing for a transformers backend.
_IGNORED_KEYS = frozenset({"detokenize", "skip_special_tokens", "spaces_between_special_tokens", "n"})


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters (vLLM's names and conventions).

    Attributes:
        temperature: 0 means greedy.
        top_p: nucleus mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; -1 or 0 disables it.
        max_tokens: the most tokens to generate (≥ 1).
        repetition_penalty: ``transformers``' multiplicative penalty on tokens already in prompt or output; 1 is off.
        stop_token_ids: extra token ids that end the request (kept in the output).
        stop: strings that end the request once the decoded output contains one (needs a ``decode`` function).
        ignore_eos: keep generating through EOS tokens.
        logprobs: return the processed log-prob of every generated token.
        seed: a per-request seed; the request then draws from its own generator.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    seed: int | None = None

    def __post_init__(self):
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"sampling_params.temperature must be a finite number >= 0, got {self.temperature}.")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"sampling_params.top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise ValueError(f"sampling_params.top_k must be -1 (off), 0 (off) or a positive int, got {self.top_k}.")
        if self.max_tokens < 1:
            raise ValueError(f"sampling_params.max_tokens must be >= 1, got {self.max_tokens}.")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"sampling_params.repetition_penalty must be > 0, got {self.repetition_penalty}.")

    @classmethod
    def from_request(cls, params: dict, *, default_max_tokens: int) -> SamplingParams:
        """Build from verl's agent-loop dict (vLLM keys; ``max_new_tokens`` is SGLang's name for ``max_tokens``).

        Raises:
            ValueError: naming any key this backend does not implement, rather than silently ignoring it.
        """
        params = dict(params)
        max_tokens = params.pop("max_tokens", None)
        if max_tokens is None:
            max_tokens = params.pop("max_new_tokens", None)
        else:
            params.pop("max_new_tokens", None)
        top_k = params.pop("top_k", -1)
        logprobs = params.pop("logprobs", None)
        kwargs = dict(
            temperature=float(params.pop("temperature", 1.0)),
            top_p=float(params.pop("top_p", 1.0)),
            top_k=-1 if top_k is None else int(top_k),
            max_tokens=int(default_max_tokens if max_tokens is None else max_tokens),
            repetition_penalty=float(params.pop("repetition_penalty", 1.0) or 1.0),
            stop_token_ids=tuple(int(t) for t in (params.pop("stop_token_ids", None) or ())),
            stop=_as_tuple(params.pop("stop", None)),
            ignore_eos=bool(params.pop("ignore_eos", False)),
            # vLLM takes an int (how many top log-probs besides the chosen one, so 0 means "chosen only") or None;
            # verl's agent loop sends a bool.
            logprobs=logprobs is not None and logprobs is not False,
            seed=params.pop("seed", None),
        )
        unknown = sorted(k for k in params if k not in _IGNORED_KEYS)
        if unknown:
            raise ValueError(
                f"The transformers rollout (actor_rollout_ref.rollout.name=hf) does not implement the sampling "
                f"parameter(s) {unknown}; remove them from the request or use rollout.name=vllm."
            )
        return cls(**kwargs)


def _as_tuple(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    return tuple(stop)


@dataclass
class SampleOutput:
    """One request's result: generated ids, their processed log-probs (or None) and why it ended."""

    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str  # "stop" (EOS, stop token or stop string) or "length"
    extra: dict = field(default_factory=dict)


def process_logits(
    logits: torch.Tensor,
    generated: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    repetition_penalty: torch.Tensor,
) -> torch.Tensor:
    """Apply the per-row logits processors in ``transformers``' order; return the processed scores.

    Args:
        logits: ``(B, V)`` float32 next-token logits.
        generated: ``(B, L)`` long, the ids seen so far (prompt and output; padding may be any id whose penalty
            does not matter, e.g. masked to a real token of the row).
        temperature: ``(B,)``; rows with 0 (greedy) are left unscaled.
        top_k: ``(B,)`` long; values ≤ 0 or ≥ V disable it for the row.
        top_p: ``(B,)``; 1 disables it for the row.
        repetition_penalty: ``(B,)``; 1 disables it for the row.

    Returns:
        ``(B, V)`` scores with removed tokens at ``-inf``.
    """
    scores = logits
    if bool((repetition_penalty != 1.0).any()):
        # transformers' RepetitionPenaltyLogitsProcessor: divide positive logits, multiply negative ones.
        picked = scores.gather(1, generated)
        penalty = repetition_penalty[:, None]
        picked = torch.where(picked < 0, picked * penalty, picked / penalty)
        scores = scores.scatter(1, generated, picked)
    scaled_rows = temperature > 0
    if bool((temperature[scaled_rows] != 1.0).any()):
        scores = scores / torch.where(scaled_rows, temperature, torch.ones_like(temperature))[:, None]
    vocab = scores.shape[-1]
    k_rows = (top_k > 0) & (top_k < vocab)
    if bool(k_rows.any()):
        kmax = int(top_k[k_rows].max())
        top_values = torch.topk(scores, kmax, dim=-1).values  # (B, kmax), descending
        kth = top_values.gather(1, (top_k.clamp(1, kmax) - 1)[:, None])
        kth = torch.where(k_rows[:, None], kth, torch.full_like(kth, -math.inf))
        scores = scores.masked_fill(scores < kth, -math.inf)
    p_rows = top_p < 1.0
    if bool(p_rows.any()):
        # transformers' TopPLogitsWarper: drop the low tail whose cumulative mass is ≤ 1 − p, keep ≥ 1 token.
        sorted_scores, sorted_idx = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1.0 - top_p)[:, None]
        remove_sorted[:, -1] = False
        remove_sorted &= p_rows[:, None]
        remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, -math.inf)
    return scores


@torch.no_grad()
def generate_batch(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    *,
    eos_token_ids: Sequence[int] = (),
    pad_token_id: int = 0,
    decode: Callable[[list[int]], str] | None = None,
    device: torch.device | str | None = None,
) -> list[SampleOutput]:
    """Generate for a batch of requests in one KV-cached decode loop (see the module docstring).

    Args:
        model: a ``transformers`` causal LM (``model(input_ids, attention_mask, position_ids, past_key_values,
            use_cache=True)`` → ``.logits``, ``.past_key_values``), in eval mode.
        prompts: B prompt token-id lists (non-empty).
        params: B :class:`SamplingParams`.
        eos_token_ids: ids that end a request unless its ``ignore_eos`` is set.
        pad_token_id: id written into left padding and into finished rows.
        decode: ids → text; needed only for requests with ``stop`` strings.
        device: where to run (default: the model's device).

    Returns:
        B :class:`SampleOutput`, in the order of ``prompts``.
    """
    if len(prompts) != len(params):
        raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
    if not prompts:
        return []
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if any(p.stop for p in params) and decode is None:
        raise ValueError("stop strings need a decode function")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    batch = len(prompts)
    max_prompt = max(len(p) for p in prompts)
    input_ids = torch.full((batch, max_prompt), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, max_prompt), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, max_prompt - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
        attention_mask[row, max_prompt - len(prompt) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)

    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    penalty = torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=device)
    greedy = temperature == 0
    budgets = [p.max_tokens for p in params]
    generators = [_generator(p.seed, device) for p in params]
    eos = set(int(t) for t in eos_token_ids)
    enders = [set(p.stop_token_ids) | (set() if p.ignore_eos else eos) for p in params]

    # Ids seen so far, for the repetition penalty: padding is replaced by the row's last prompt token.
    seen = torch.where(attention_mask.bool(), input_ids, input_ids[:, -1:])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out_ids: list[list[int]] = [[] for _ in range(batch)]
    out_lps: list[list[float]] = [[] for _ in range(batch)]
    finish = [None] * batch
    past = None
    step_ids, step_pos = input_ids, position_ids
    for _ in range(max(budgets)):
        out = model(
            input_ids=step_ids, attention_mask=attention_mask, position_ids=step_pos, past_key_values=past,
            use_cache=True,
        )  # fmt: skip
        past = out.past_key_values
        logits = out.logits[:, -1, :].float()
        scores = process_logits(logits, seen, temperature, top_k, top_p, penalty)
        probs = scores.softmax(dim=-1)
        if all(g is None for g in generators):
            tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
        else:
            tokens = torch.multinomial(probs, num_samples=1).squeeze(1) if any(g is None for g in generators) else None
            tokens = _seeded_draws(probs, generators, tokens)
        tokens = torch.where(greedy, scores.argmax(dim=-1), tokens)
        want_lp = any(p.logprobs for p in params)
        if want_lp:
            logprobs = torch.where(greedy[:, None], logits.log_softmax(-1), scores.log_softmax(-1))
            chosen_lp = logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
        chosen = tokens.tolist()
        for row in range(batch):
            if finish[row] is not None:
                chosen[row] = pad_token_id
                continue
            token = chosen[row]
            out_ids[row].append(token)
            if want_lp:
                out_lps[row].append(chosen_lp[row])
            if token in enders[row]:
                finish[row] = "stop"
            elif params[row].stop and any(s in decode(out_ids[row]) for s in params[row].stop):
                finish[row] = "stop"
            elif len(out_ids[row]) >= budgets[row]:
                finish[row] = "length"
        if all(f is not None for f in finish):
            break
        step_ids = torch.tensor(chosen, dtype=torch.long, device=device)[:, None]
        seen = torch.cat([seen, step_ids], dim=1)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=1)
        step_pos = step_pos[:, -1:] + 1
    return [
        SampleOutput(out_ids[row], out_lps[row] if params[row].logprobs else None, finish[row] or "length")
        for row in range(batch)
    ]


def _generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed))
    return generator


def _seeded_draws(probs: torch.Tensor, generators: list, shared: torch.Tensor | None) -> torch.Tensor:
    """Rows with their own generator draw from it; the rest keep the shared draw."""
    tokens = shared.clone() if shared is not None else torch.zeros(probs.shape[0], dtype=torch.long)
    tokens = tokens.to(probs.device)
    for row, generator in enumerate(generators):
        if generator is not None:
            tokens[row] = torch.multinomial(probs[row], num_samples=1, generator=generator)[0]
    return tokens
