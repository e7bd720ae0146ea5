"""A model by its architecture (`model.arch`, lmpipe.registry.ARCHITECTURES): built fresh
(`build_model`), read from the final checkpoint (`load_final_checkpoint`) or from a converted
folder (`load_hf`). lmpipe.models exports these names; they load on first use, so that importing
the package (as the registry does, for the architectures' shape modules) imports neither this
module's config and registry (a circle) nor torch.

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
from lmpipe.models import LMPIPE_META, META_KEYS
from lmpipe.registry import ARCHITECTURES


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
