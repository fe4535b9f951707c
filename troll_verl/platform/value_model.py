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
"""verl's FSDP value engine (PPO's critic) on the CPU platform.

verl 0.9.1 loads a critic with ``attn_implementation="flash_attention_2"`` written into the call
(``verl.utils.model.load_valuehead_model``, both its branches), which needs the flash-attn package and a CUDA GPU,
whatever ``critic.model.override_config.attn_implementation`` says. On the CPU platform the critic is built the same
way (``AutoModelForTokenClassification`` with one label from the policy's checkpoint, verl's model patches, the
engine's dtype) with the attention of the model's config, ``sdpa`` under the platform's overrides. The actor's
language model is verl's own code path: it already takes the config's attention.
"""

from __future__ import annotations

import functools
import warnings

__all__ = ["make_cpu_value_engine_cls"]


@functools.cache
def make_cpu_value_engine_cls():
    """Build :class:`CPUFSDPEngineWithValueHead` once per process (imports verl lazily, so this module stays cheap to
    import); the same class every call, so a registry holding it is recognised as holding it."""
    import torch
    from transformers import AutoModelForTokenClassification
    from verl.models.transformers.monkey_patch import apply_monkey_patch
    from verl.utils.fsdp_utils import get_init_weight_context_manager
    from verl.utils.torch_dtypes import PrecisionType
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead

    class CPUFSDPEngineWithValueHead(FSDPEngineWithValueHead):
        """verl's :class:`FSDPEngineWithValueHead` whose critic loads with the config's attention implementation."""

        def _build_module(self):
            model_config = self.model_config
            if model_config.use_liger:
                raise ValueError(
                    "critic.model.use_liger=True needs Liger's GPU kernels; the CPU platform runs the critic without "
                    "them. Set critic.model.use_liger=False."
                )
            dtype = self.engine_config.model_dtype
            if dtype is None:  # verl's rule: fp32 to train, bf16 forward-only
                dtype = torch.float32 if not self.engine_config.forward_only else torch.bfloat16
            dtype = PrecisionType.to_dtype(dtype)
            hf_config = model_config.hf_config
            # verl's settings for a one-label token-classification critic (load_valuehead_model's caller)
            hf_config.num_labels = 1
            hf_config.classifier_dropout = 0.0
            hf_config.hidden_dropout = "0"
            hf_config.summary_dropout_prob = 0.0
            init_context = get_init_weight_context_manager(
                use_meta_tensor=not hf_config.tie_word_embeddings, mesh=self.device_mesh
            )
            with init_context(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # NOTE: verl passes attn_implementation="flash_attention_2" here; the config's (sdpa) is used instead.
                module = AutoModelForTokenClassification.from_pretrained(
                    pretrained_model_name_or_path=model_config.local_path,
                    torch_dtype=dtype,
                    config=hf_config,
                    trust_remote_code=model_config.trust_remote_code,
                )
                options = model_config.fused_kernel_options
                apply_monkey_patch(
                    model=module,
                    use_remove_padding=self.use_remove_padding,
                    ulysses_sp_size=self.ulysses_sequence_parallel_size,
                    use_fused_kernels=model_config.use_fused_kernels,
                    fused_kernels_backend=options.get("impl_backend", None) if options is not None else None,
                )
                module.to(dtype)
                if model_config.enable_gradient_checkpointing:
                    module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return module

    return CPUFSDPEngineWithValueHead
