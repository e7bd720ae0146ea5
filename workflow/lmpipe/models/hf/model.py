"""A Hugging Face causal LM (AutoModelForCausalLM) behind the interface our own models offer
(lmpipe/models/__init__.py), so the trainer, FSDP2, DCP checkpoints and the scorers treat it as
they treat GPT-2. Knows nothing of parallelism.

- The model is the folder's (`model.path`): its config and its safetensors weights, loaded in
  fp32 with no network (`use_safetensors=True`: a pickle checkpoint is never unpickled);
  `trust_remote_code` only where the model's config says so.
- `blocks()` are its decoder layers, found as Hugging Face's own sharding finds them: the
  modules whose class is named in the model's `_no_split_modules` (torchtitan shards a Llama's
  `layers` the same way, one `fully_shard` each).
- The training loss is ours (lmpipe.models.head_loss) on the base model's hidden states and the
  LM head's weight, so the chunked head and the head on counted positions work here too.
- Parameter names are the HF model's under `hf.` (DCP checkpoints; `write_hf` strips nothing:
  it is the model's own `save_pretrained`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from lmpipe import hf_folder
from lmpipe.config import ModelConfig
from lmpipe.models.head_loss import linear_cross_entropy, soft_cap
from lmpipe.registry import ARCHITECTURES


def load_pretrained(folder: Path, trust_remote_code: bool) -> nn.Module:
    """The folder's causal LM in fp32 on the CPU, from safetensors only, offline."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_folder.check_folder(folder, trust_remote_code)
    cfg = AutoConfig.from_pretrained(
        folder, local_files_only=True, trust_remote_code=trust_remote_code
    )
    cfg.use_cache = False  # training; generation asks for the cache itself
    return AutoModelForCausalLM.from_pretrained(
        folder, config=cfg, dtype=torch.float32, use_safetensors=True, local_files_only=True,
        trust_remote_code=trust_remote_code, attn_implementation=attention_of(cfg),
    )  # fmt: skip


def attention_of(cfg) -> str:
    """PyTorch's SDPA (whose kernel train.attention_backend picks) where the family's class has
    it; else its eager attention (Gemma 2, which soft-caps its attention scores, has no SDPA).
    A class from the folder's own code (trust_remote_code) is asked for SDPA."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    known = type(cfg) in MODEL_FOR_CAUSAL_LM_MAPPING
    return (
        "eager" if known and not MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]._supports_sdpa else "sdpa"
    )


class HFCausalLM(nn.Module):
    """The folder's model as ours: forward/hidden_states/head/blocks and the loss of head_loss."""

    def __init__(self, config: ModelConfig, hf: nn.Module | None = None):
        super().__init__()
        if config.arch != "hf":
            raise ValueError(f"HFCausalLM needs model.arch hf, not {config.arch!r}")
        self.config = config
        self.folder = hf_folder.resolve(config.path, config.revision)
        self.hf = hf if hf is not None else load_pretrained(self.folder, config.trust_remote_code)
        # Gemma-style final soft-capping of the logits, where the model has it
        self.softcap = getattr(self.hf.config, "final_logit_softcapping", None)
        # the logits scaled as the model's own forward scales them: Cohere multiplies them by
        # logit_scale, Granite divides them by logits_scaling
        self.logit_scale = getattr(self.hf.config, "logit_scale", None)
        self.logits_scaling = getattr(self.hf.config, "logits_scaling", None)
        self.loss_fn = linear_cross_entropy  # the trainer may set a compiled or chunked one
        self.head_on_counted_only = False
        self.padded_head_matmul = False  # no padding: the vocabulary is the model's own

    @torch.no_grad()
    def init_weights(self) -> None:
        """A fresh random init, the model's own (`_init_weights` on every module)."""
        self.hf.apply(self.hf._init_weights)
        self.hf.tie_weights()

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())  # a tied head counted once
        if non_embedding:
            n -= self.hf.get_input_embeddings().weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> int:
        return ARCHITECTURES["hf"].flops_per_token(self.config, seq_len)

    def head_flops_per_token(self) -> int:
        return ARCHITECTURES["hf"].head_flops_per_token(self.config)

    def blocks(self) -> list[nn.Module]:
        """The decoder layers: the modules of the classes in `_no_split_modules`, in order."""
        names = set(getattr(self.hf, "_no_split_modules", None) or ())
        # by the class's ancestry: FSDP2 makes each sharded layer an FSDP<Class> subclass
        blocks = [m for m in self.hf.modules() if any(c.__name__ in names for c in type(m).__mro__)]
        if not blocks:
            raise ValueError(
                f"{self.folder}: {type(self.hf).__name__} names no decoder layer class"
                " (_no_split_modules): FSDP cannot shard it by layer"
            )
        return blocks

    def hidden_states(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The trunk up to the final norm: (B, T) -> (B, T, C); packed rows give positions
        (B, T) and a boolean mask (B, 1, T, T) that the model's attention takes as is (SDPA), or
        as the additive mask eager attention adds to its scores (0 where a query sees a key)."""
        if mask is not None and self.hf.config._attn_implementation == "eager":
            low = torch.finfo(self.hf.dtype).min
            mask = torch.zeros(mask.shape, dtype=self.hf.dtype, device=mask.device).masked_fill(
                ~mask, low
            )
        out = self.hf.base_model(
            input_ids=idx, position_ids=positions, attention_mask=mask, use_cache=False
        )
        return out.last_hidden_state

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits over the vocabulary for hidden states h (..., C)."""
        logits = self.scaled(self.hf.get_output_embeddings()(h).float())
        return soft_cap(logits, self.softcap)

    def scaled(self, t: torch.Tensor) -> torch.Tensor:
        """Logits scaled as the model's forward scales them (Cohere's logit_scale, Granite's
        logits_scaling); or hidden states before the head's matmul, which is linear in them."""
        if self.logit_scale is not None:
            t = t * self.logit_scale
        if self.logits_scaling is not None:
            t = t / self.logits_scaling
        return t

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(fp32 logits (B, T, V), None) without targets; (None, mean loss) with them."""
        x = self.hidden_states(idx)
        if targets is None:
            return self.head(x), None
        lm_head = self.hf.get_output_embeddings()
        weight = lm_head.weight
        if self.head_on_counted_only:
            counted = targets != -1
            x, targets = x[counted], targets[counted]  # a host sync (the shape)
        if getattr(lm_head, "bias", None) is not None:  # Phi's head: x W^T + b = [x, 1] [W, b]^T
            x = torch.cat([x, x.new_ones(*x.shape[:-1], 1)], dim=-1)
            weight = torch.cat([weight, lm_head.bias[:, None].to(weight.dtype)], dim=1)
        loss = self.loss_fn(self.scaled(x), weight, targets, self.config.vocab_size, self.softcap)
        return None, loss
