"""What chat fine-tuning changes in the trainer (lmpipe.train), and nothing else.

An SFT run's config (`lmpipe.config.sft_params`) has `sft: {epochs, warmup_ratio}` and the
trainer gets `--init` (the base's final checkpoint or a Hugging Face GPT-2 folder) and, as
`--tokens-manifest`, the conversations manifest of lmpipe.sft_data. Four things differ:

- the schedule: max_steps = epochs * steps an epoch, warmup = ceil(warmup_ratio * max_steps),
  as Hugging Face's Trainer (which Vicuna's train.py uses) derives them;
- the initial weights: the base model's, loaded before FSDP shards them;
- the data: ConversationLoader and the held-out conversations instead of token shards;
- the loss: the LM head runs on the counted tokens only (`GPT.head_on_counted_only`); on the
  embedded conversations that is a quarter of them, and a step takes ~4x less time.
Everything else (FSDP, checkpoints, resume, signals, metrics) is the pretraining code path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import torch

from lmpipe.config import SFTConfig, TrainConfig, from_dict
from lmpipe.loader import ConversationLoader, conversation_val_batches
from lmpipe.model import GPT
from lmpipe.sft_data import load_split


def train_rows(manifest: str | Path) -> int:
    return json.loads(Path(manifest).read_text())["kept"]["train"]


def schedule(tc: TrainConfig, sft: dict[str, Any], manifest: str | Path) -> TrainConfig:
    """`tc` with max_steps and warmup_steps from the epochs and the number of conversations."""
    s = from_dict(SFTConfig, sft, "sft")
    rows_per_step = tc.batch_tokens // tc.seq_len
    steps_per_epoch = train_rows(manifest) // rows_per_step
    if steps_per_epoch == 0:
        raise ValueError(
            f"{manifest}: {train_rows(manifest)} training conversations, fewer than one step of"
            f" {rows_per_step} (train.batch_tokens / train.seq_len)"
        )
    max_steps = s.epochs * steps_per_epoch
    warmup = math.ceil(s.warmup_ratio * max_steps)
    return dataclasses.replace(tc, max_steps=max_steps, warmup_steps=warmup)


def loaders(
    manifest: str | Path, tc: TrainConfig, rank: int, world_size: int
) -> tuple[ConversationLoader, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The training loader and this rank's held-out batches (the val loss during training)."""
    x, y = load_split(manifest, "train")
    if x.shape[1] != tc.seq_len:
        raise ValueError(f"{manifest}: rows of {x.shape[1]} tokens, train.seq_len {tc.seq_len}")
    loader = ConversationLoader(x, y, tc.micro_batch, tc.batch_tokens, rank, world_size, tc.seed)
    vx, vy = load_split(manifest, "val")
    return loader, conversation_val_batches(vx, vy, tc.micro_batch, tc.val_tokens, rank, world_size)


def base_identity(path: str | Path) -> str:
    """The initial weights' identity: a checkpoint's settings hash and step, or the HF sha256."""
    path = Path(path)
    if (path / "meta.json").is_file():
        meta = json.loads((path / "meta.json").read_text())
        return f"run {meta['run']} settings {meta['settings_hash']} step {meta['step']}"
    h = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    return f"hf model.safetensors {h}"


def load_base(model: GPT, path: str | Path) -> str:
    """Copy the base weights into the unsharded `model`; return their identity (for the hash).

    `path` is a final checkpoint (DCP + meta.json) or a Hugging Face GPT-2 folder imported
    through lmpipe.convert. The base must have the run's shape: a mismatch names both.
    """
    from lmpipe.convert import load_final_checkpoint, load_native_from_hf

    path = Path(path)
    if (path / "meta.json").is_file():
        base, _ = load_final_checkpoint(path)
    elif (path / "config.json").is_file():
        base = load_native_from_hf(path)
    else:
        raise FileNotFoundError(f"{path}: neither a final checkpoint nor a Hugging Face folder")
    if base.config != model.config:
        raise ValueError(f"{path}: base model {base.config} is not the run's model {model.config}")
    model.load_state_dict(base.state_dict(), strict=True)
    return base_identity(path)
