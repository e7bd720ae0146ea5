"""An lmpipe `modern` export as a transformers causal LM (trust_remote_code), with `generate`.

Shipped into the export folder beside configuration_lmpipe_modern.py and copies of lmpipe's own
model code (lmpipe_modern_model.py, lmpipe_modern_attention.py, lmpipe_modern_head_loss.py:
lmpipe/models/modern/model.py, models/attention.py and models/head_loss.py, their lmpipe imports
made relative), which transformers copies with it into its module cache: it needs torch and
transformers, not lmpipe. The weights are model.safetensors as lmpipe writes it (the native
parameter names; a tied head stored once), under `model.`, the base model's prefix.

`generate` decodes with a KV cache (transformers' DynamicCache, one layer a block) through the
model's own `decode`, whose logits are the full forward's: the window is block-wise and counted
from position 0, so the cache keeps every key and the mask drops those behind the window (a
transformers sliding-window layer would drop keys by count). The document mask needs all the
tokens so far, which `prepare_inputs_for_generation` hands on as `context_ids`."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_lmpipe_modern import LmpipeModernConfig
from .lmpipe_modern_model import ModernGPT


class LmpipeModernForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = LmpipeModernConfig
    base_model_prefix = "model"  # the file's names lack it: transformers adds it on load

    def __init__(self, config: LmpipeModernConfig) -> None:
        super().__init__(config)
        self.model = ModernGPT(SimpleNamespace(**config.model))
        if config.model["tie_embeddings"]:
            self._tied_weights_keys = {"model.lm_head.weight": "model.transformer.wte.weight"}
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: every weight is in model.safetensors (a fresh model: ModernGPT's own init)."""

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, **kwargs) -> dict:
        """transformers' inputs (the new tokens, the cache), and all the tokens so far."""
        inputs = super().prepare_inputs_for_generation(input_ids, **kwargs)
        inputs["context_ids"] = input_ids
        return inputs

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
        use_cache: bool | None = None,
        attention_mask: torch.Tensor | None = None,
        context_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """The model's fp32 logits (B, T, vocab_size), soft-capped as trained; with labels,
        transformers' shifted mean cross-entropy (labels of -100 do not count). With a cache,
        or use_cache, input_ids follow the cache's tokens (context_ids: all of them), and the
        cache, extended, is returned."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("attention_mask: padding is not supported (every entry must be 1)")
        if cache is None and use_cache:
            cache = DynamicCache(config=self.config)
        if cache is None:
            logits, _ = self.model(input_ids)
        else:
            logits = self.model.decode(input_ids, cache, context_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1)
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)
