"""The modern model <-> a native folder in the place of a Hugging Face one (model/hf/).

No transformers class computes this model's logits (an un-gated ReLU² MLP, weightless RMSNorm
and QK-norm, soft-capped logits), so `convert` writes the native state dict as it is:
`model.safetensors` (the parameter names of lmpipe/models/modern/model.py, fp32; a tied head is
stored once, as `transformer.wte.weight`), `config.json` with `lmpipe_arch: modern` and the
model's config (shape and settings), the GPT-2 tokenizer's files (as GPT-2's folder has them) and
`lmpipe_meta.json`. `lmpipe.models.load_hf` reads it back by `lmpipe_arch`; the lm-eval harness
reads it through the `lmpipe` model adapter (lmpipe.eval.lm_eval_model).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lmpipe.config import model_config
from lmpipe.models import LMPIPE_META
from lmpipe.models.gpt2.hf import export_tokenizer, mark_tokenizer
from lmpipe.models.modern.model import ModernGPT

FORMAT = "lmpipe native: model.safetensors is lmpipe.models.modern's state dict"


def native_state_dict(model: ModernGPT) -> dict[str, torch.Tensor]:
    """The parameters as stored: fp32, contiguous, a tied head once (safetensors holds no
    shared tensors)."""
    state = model.state_dict()
    if model.config.tie_embeddings:
        del state["lm_head.weight"]
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}


def write_hf(model: ModernGPT, tokenizer_dir: str | Path, out_dir: str | Path, meta: dict) -> None:
    """Save the native folder: weights, config.json, tokenizer, lmpipe_meta.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    c = model.config
    save_file(
        native_state_dict(model), str(out_dir / "model.safetensors"), metadata={"format": "pt"}
    )
    config = {
        "lmpipe_arch": "modern",
        "lmpipe_format": FORMAT,
        "model": dataclasses.asdict(c),
        "n_positions": c.block_size,  # the context, under the name harnesses look for
        "vocab_size": c.vocab_size,
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    tokenizer, marker = export_tokenizer(tokenizer_dir, c.vocab_size)
    tokenizer.model_max_length = c.block_size
    tokenizer.save_pretrained(out_dir)
    mark_tokenizer(out_dir, marker)
    (out_dir / LMPIPE_META).write_text(json.dumps(meta, indent=1) + "\n")


def load_hf(hf_dir: str | Path) -> ModernGPT:
    """The native model of a folder `write_hf` wrote; every key and shape checked."""
    hf_dir = Path(hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    model = ModernGPT(model_config(cfg["model"], f"{hf_dir}/config.json: model"))
    weights = load_file(str(hf_dir / "model.safetensors"))
    state = model.state_dict()
    wanted = set(state) - ({"lm_head.weight"} if model.config.tie_embeddings else set())
    assert wanted == set(weights), f"{hf_dir}: key mismatch {sorted(wanted ^ set(weights))}"
    for k, v in weights.items():
        assert v.shape == state[k].shape, (
            f"{k}: stored {tuple(v.shape)}, ours {tuple(state[k].shape)}"
        )
        state[k] = v.to(torch.float32)
    if model.config.tie_embeddings:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()
