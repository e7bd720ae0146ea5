"""The config of an lmpipe `modern` export, for transformers' AutoConfig (trust_remote_code).

Shipped into the export folder as it is, beside modeling_lmpipe_modern.py; it needs transformers
alone. `model` is lmpipe's model config (its shape and settings, config.json's "model"), which
the shipped model code reads as attributes; `num_hidden_layers`, its blocks, sizes transformers'
KV cache (one layer a block)."""

from __future__ import annotations

from transformers import PretrainedConfig


class LmpipeModernConfig(PretrainedConfig):
    model_type = "lmpipe_modern"

    def __init__(self, model: dict | None = None, **kwargs) -> None:
        self.model = dict(model or {})
        kwargs.setdefault("num_hidden_layers", self.model.get("n_layer"))
        super().__init__(**kwargs)
