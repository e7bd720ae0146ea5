"""The modern model <-> its folder in the place of a Hugging Face one (model/hf/): lmpipe's
and, through the model code it ships, transformers' (trust_remote_code).

No transformers class computes this model's logits (an un-gated ReLU² MLP, weightless RMSNorm
and QK-norm, soft-capped logits), so `convert` writes the native state dict as it is:
`model.safetensors` (the parameter names of lmpipe/models/modern/model.py, fp32; a tied head is
stored once, as `transformer.wte.weight`), `config.json` with `lmpipe_arch: modern` and the
model's config (shape and settings), the GPT-2 tokenizer's files (as GPT-2's folder has them) and
`lmpipe_meta.json`. `lmpipe.models.load_hf` reads it back by `lmpipe_arch`; the lm-eval harness
reads it through the `lmpipe` model adapter (lmpipe.eval.lm_eval_model).

The folder also loads with transformers alone, as hub models with custom code do:
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`. config.json's `auto_map`
names remote/configuration_lmpipe_modern.py and remote/modeling_lmpipe_modern.py, written into the
folder with copies of the model's own code (`SHIPPED`: model.py, ../attention.py,
../head_loss.py, their lmpipe imports rewritten to relative ones, each rewrite checked), which
transformers copies into its module cache with the modeling file. So the logits transformers
computes are this model's, by the same code; without trust_remote_code transformers refuses.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lmpipe.config import model_config
from lmpipe.data.chat_format import add_chat_template
from lmpipe.models import LMPIPE_META
from lmpipe.models.gpt2.hf import export_tokenizer, mark_tokenizer
from lmpipe.models.modern.model import ModernGPT

FORMAT = "lmpipe native: model.safetensors is lmpipe.models.modern's state dict"
MODELS = Path(__file__).resolve().parent.parent  # lmpipe/models/
REMOTE = Path(__file__).resolve().parent / "remote"
# the folder's copies of lmpipe's model code: name in the folder -> (source, {line: replacement})
SHIPPED = {
    "lmpipe_modern_model.py": (
        MODELS / "modern" / "model.py",
        {
            "from lmpipe.config import ModelConfig, model_config\n": (
                "from typing import Any\n\n"
                "# shipped without lmpipe: the config is config.json's `model` as attributes;\n"
                "# lmpipe's config check (modern_config) and FLOPs registry (flops_per_token)\n"
                "# are not here\n"
                "ModelConfig = Any\n"
                "model_config = ARCHITECTURES = None\n"
            ),
            "from lmpipe.models.attention import": "from .lmpipe_modern_attention import",
            "from lmpipe.models.head_loss import": "from .lmpipe_modern_head_loss import",
            "from lmpipe.registry import ARCHITECTURES\n": "",
        },
    ),
    "lmpipe_modern_attention.py": (MODELS / "attention.py", {}),
    "lmpipe_modern_head_loss.py": (MODELS / "head_loss.py", {}),
    "configuration_lmpipe_modern.py": (REMOTE / "configuration_lmpipe_modern.py", {}),
    "modeling_lmpipe_modern.py": (REMOTE / "modeling_lmpipe_modern.py", {}),
}
AUTO_MAP = {
    "AutoConfig": "configuration_lmpipe_modern.LmpipeModernConfig",
    "AutoModelForCausalLM": "modeling_lmpipe_modern.LmpipeModernForCausalLM",
}
LMPIPE_IMPORT = re.compile(r"^\s*(from|import)\s+lmpipe\b", re.MULTILINE)


def ship_code(out_dir: Path) -> None:
    """Write SHIPPED's files into the folder: each source with its rewrites, every one found
    (a changed import fails here, not on a user's machine), no lmpipe import left."""
    for name, (source, rewrites) in SHIPPED.items():
        text = source.read_text()
        for old, new in rewrites.items():
            assert text.count(old) == 1, f"{source}: {old!r} not found once, cannot ship it"
            text = text.replace(old, new)
        assert not LMPIPE_IMPORT.search(text), f"{source}: an lmpipe import left in {name}"
        (out_dir / name).write_text(text)


def native_state_dict(model: ModernGPT) -> dict[str, torch.Tensor]:
    """The parameters as stored: fp32, contiguous, a tied head once (safetensors holds no
    shared tensors)."""
    state = model.state_dict()
    if model.config.tie_embeddings:
        del state["lm_head.weight"]
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}


def write_hf(model: ModernGPT, tokenizer_dir: str | Path, out_dir: str | Path, meta: dict) -> None:
    """Save the folder: weights, config.json (with `auto_map`), the shipped code, the tokenizer
    (a chat run's with its chat_template), lmpipe_meta.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    c = model.config
    save_file(
        native_state_dict(model), str(out_dir / "model.safetensors"), metadata={"format": "pt"}
    )
    tokenizer, marker = export_tokenizer(tokenizer_dir, c.vocab_size)
    config = {
        "lmpipe_arch": "modern",
        "lmpipe_format": FORMAT,
        "model": dataclasses.asdict(c),
        "n_positions": c.block_size,  # the context, under the name harnesses look for
        "vocab_size": c.vocab_size,
        # transformers' keys: its AutoModelForCausalLM through the shipped code
        "model_type": "lmpipe_modern",
        "architectures": ["LmpipeModernForCausalLM"],
        "auto_map": AUTO_MAP,
        "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "dtype": "float32",
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    ship_code(out_dir)
    tokenizer.model_max_length = c.block_size
    add_chat_template(tokenizer, meta)  # a chat run's: the Vicuna template
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
