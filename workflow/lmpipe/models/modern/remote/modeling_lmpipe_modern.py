"""An lmpipe `modern` export as a transformers causal LM (trust_remote_code).

Shipped into the export folder beside configuration_lmpipe_modern.py and copies of lmpipe's own
model code (lmpipe_modern_model.py, lmpipe_modern_attention.py, lmpipe_modern_head_loss.py:
lmpipe/models/modern/model.py, models/attention.py and models/head_loss.py, their lmpipe imports
made relative), which transformers copies with it into its module cache: it needs torch and
transformers, not lmpipe. The weights are model.safetensors as lmpipe writes it (the native
parameter names; a tied head stored once), under `model.`, the base model's prefix."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_lmpipe_modern import LmpipeModernConfig
from .lmpipe_modern_model import ModernGPT


class LmpipeModernForCausalLM(PreTrainedModel):
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

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs
    ) -> CausalLMOutput:
        """The model's fp32 logits (B, T, vocab_size), soft-capped as trained; with labels,
        transformers' shifted mean cross-entropy (labels of -100 do not count)."""
        logits, _ = self.model(input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1)
            )
        return CausalLMOutput(loss=loss, logits=logits)
