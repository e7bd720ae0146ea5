"""An HF run's export (model/hf/): the model's own `save_pretrained` (safetensors) and its
tokenizer, so `AutoModelForCausalLM.from_pretrained` and lm-eval's `hf` model read it as they
read the base; `lmpipe_arch: hf` in its config.json and `lmpipe_meta.json` beside it."""

from __future__ import annotations

import json
from pathlib import Path

from lmpipe.config import model_config
from lmpipe.data.chat_format import add_chat_template
from lmpipe.models import LMPIPE_META
from lmpipe.models.hf.model import HFCausalLM, load_pretrained


def write_hf(
    model: HFCausalLM, tokenizer_dir: str | Path | None, out_dir: str | Path, meta: dict
) -> None:
    """Save the weights (safetensors), config.json, the tokenizer (the base's own folder's, not
    `tokenizer_dir`, which is GPT-2's; a chat run's with the Vicuna chat_template) and
    lmpipe_meta.json."""
    from transformers import AutoTokenizer

    out_dir = Path(out_dir)
    hf = model.hf
    hf.config.lmpipe_arch = "hf"
    hf.config.use_cache = True  # off for training (load_pretrained); generation wants its cache
    hf.save_pretrained(out_dir, safe_serialization=True)
    del hf.config.lmpipe_arch
    hf.config.use_cache = False
    tokenizer = AutoTokenizer.from_pretrained(
        model.folder, local_files_only=True, trust_remote_code=model.config.trust_remote_code
    )
    add_chat_template(tokenizer, meta)  # a chat run's: the Vicuna template, not the base's
    tokenizer.save_pretrained(out_dir)
    (out_dir / LMPIPE_META).write_text(json.dumps(meta, indent=1) + "\n")


def load_hf(hf_dir: str | Path) -> HFCausalLM:
    """The model of a folder `write_hf` wrote (or any causal LM folder), as ours."""
    hf_dir = Path(hf_dir)
    meta = (
        json.loads(meta_path.read_text()) if (meta_path := hf_dir / LMPIPE_META).is_file() else {}
    )
    trust = bool((meta.get("model") or {}).get("trust_remote_code", False))
    config = model_config(
        {"arch": "hf", "path": str(hf_dir), "trust_remote_code": trust}, str(hf_dir)
    )
    return HFCausalLM(config, load_pretrained(hf_dir, trust)).eval()
