"""Architectures, chosen by `model.arch` (lmpipe.registry.ARCHITECTURES); no distributed code.

An architecture is a package (e.g. lmpipe/models/gpt2/) whose `Model(config: ModelConfig)` is an
nn.Module that knows nothing of parallelism and offers what the trainer and evaluators call:

- `forward(idx, targets=None)`: (fp32 logits over the real vocabulary, None) without targets,
  (None, mean loss) with them (targets of -1 do not count);
- `hidden_states(idx, positions=None, mask=None)` and `head(h)`: the trunk and the LM head apart
  (scorers that need the head at a few positions only); positions (B, T) and a boolean
  attention mask (B, 1, T, T) for packed scoring rows (lmpipe.eval.packing), causal by default;
- `blocks()`: the repeated blocks, which FSDP shards (and compile compiles) one by one;
- optionally `embed(idx, positions=None)`, the stem before the blocks, and `head_loss(x,
  targets)`, the tail after them (final norm -> LM head -> loss, from the blocks' output): where
  a model has them, train.compile_scope `regions` compiles each as a region of its own
  (lmpipe.train.parallel; gpt2 and modern have them, hf not);
- `init_weights()`, `num_params()`, `flops_per_token(seq_len)`, `head_flops_per_token()`,
  `loss_fn`, the head + loss the forward trains with (lmpipe.models.head_loss: plain, compiled or
  in chunks, as the trainer sets it), and the `head_on_counted_only` switch (fine-tuning: the
  head runs only where the loss counts).

The package also brings its export adapters: `write_hf(model, tokenizer_dir, out_dir, meta)`,
`load_hf(hf_dir)` and, where the format can hold it, `write_llmc(model, path)`. `write_hf` writes
model/hf/: a transformers folder (GPT-2) or, where no transformers class computes the model's
logits (modern), a native one; its config.json's `lmpipe_arch` tells `load_hf` below which.

The final checkpoint (`train/final/`, written by lmpipe.train.checkpoint) is read here, in one
process: `{"model": state dict}` as torch.distributed.checkpoint files, plus `meta.json`.
"""

from __future__ import annotations

import importlib
import json
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from lmpipe.config import ModelConfig, model_config
from lmpipe.registry import ARCHITECTURES

META_KEYS = ("run", "model", "train", "settings_hash", "step", "tokens", "world_size")
LMPIPE_META = "lmpipe_meta.json"  # a converted folder's copy of the checkpoint's meta.json


def architecture(name: str) -> ModuleType:
    """The package of architecture `name`."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown model.arch {name!r} (known: {', '.join(ARCHITECTURES)})")
    return importlib.import_module(ARCHITECTURES[name].module)


def build_model(config: ModelConfig) -> Any:
    """A freshly initialised model of `config.arch` on the CPU."""
    return architecture(config.arch).Model(config)


def read_meta(final_dir: str | Path) -> dict:
    path = Path(final_dir) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: meta.json of the final checkpoint is missing")
    meta = json.loads(path.read_text())
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"{path}: missing key(s) {', '.join(missing)}")
    return meta


def load_final_checkpoint(final_dir: str | Path) -> tuple[Any, dict]:
    """The trained model (on the CPU, fp32) and its meta.json, from the DCP final checkpoint."""
    import torch.distributed.checkpoint as dcp

    meta = read_meta(final_dir)
    model = build_model(model_config(meta["model"], f"{final_dir}/meta.json: model"))
    state = model.state_dict()
    # DCP loads in place into the tensors we hand it; one process, so no process group (DCP
    # warns that it assumes exactly that).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": state}, checkpoint_id=str(final_dir))
    model.load_state_dict(state, strict=True)
    return model.eval(), meta


def load_hf(hf_dir: str | Path) -> Any:
    """The native model of a Hugging Face folder that `convert` wrote (or OpenAI's `gpt2`)."""
    hf_dir = Path(hf_dir)
    config = hf_dir / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{config}: not a converted model folder (no config.json)")
    cfg = json.loads(config.read_text())
    return architecture(hf_arch(cfg)).load_hf(hf_dir)


def hf_arch(cfg: dict) -> str:
    """The architecture that loads a folder of this config.json: its `lmpipe_arch` (ours), else
    a GPT-2 folder (ours, OpenAI's, a reference run's) the gpt2 architecture, else `hf`."""
    return cfg.get("lmpipe_arch") or ("gpt2" if cfg.get("model_type", "gpt2") == "gpt2" else "hf")


def read_hf_meta(hf_dir: str | Path) -> dict | None:
    path = Path(hf_dir) / LMPIPE_META
    return json.loads(path.read_text()) if path.is_file() else None
