"""Chat fine-tuning: the torchrun worker of the `train` rule's fine-tuning runs.

    python -m lmpipe.train --worker lmpipe.chat.finetune --config-json J \\
        --data results/data/vicuna-dummy/sft/manifest.json \\
        --init results/runs/embedded-a/train/final --out results/runs/embedded-a-chat/train

A fine-tuning run (`base:` and `sft: {epochs, warmup_ratio}` in its config) trains with the
pretraining loop (lmpipe.train.loop: FSDP, checkpoints, resume, signals, metrics); its Task brings
what differs:

- the schedule: max_steps = epochs * steps an epoch, warmup = ceil(warmup_ratio * max_steps),
  as Hugging Face's Trainer (which Vicuna's train.py uses) derives them;
- the starting weights: the base model's (`--init`: its final checkpoint or a Hugging Face GPT-2
  folder), loaded before FSDP shards them;
- the data: a ConversationLoader over the prepared rows and the held-out conversations; with
  `sft.replay`, a ReplayLoader (lmpipe.chat.replay) mixing the base's pretraining text (`--replay`:
  its tokens manifest) into each step's rows;
- sparse targets: the LM head runs on the counted tokens only; on the embedded conversations
  that is a quarter of them, and a step takes ~4x less time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from lmpipe import hf_folder
from lmpipe.chat.loader import (
    ConversationLoader,
    ConversationsManifest,
    conversation_val_batches,
    load_split,
    read_manifest,
)
from lmpipe.chat.replay import ReplayLoader
from lmpipe.config import SFTConfig, TrainConfig, TrainJob
from lmpipe.data.loader import Loader
from lmpipe.data.mixture import text_sources
from lmpipe.files import sha256_file
from lmpipe.models import architecture, load_final_checkpoint, load_hf
from lmpipe.train.loop import Task, worker_main
from lmpipe.train.parallel import Dist


def schedule(tc: TrainConfig, sft: SFTConfig, manifest: ConversationsManifest) -> TrainConfig:
    """`tc` with max_steps and warmup_steps from the epochs and the number of conversations."""
    rows_per_step = tc.batch_tokens // tc.seq_len
    max_steps = sft.steps(manifest.rows("train"), rows_per_step)
    if max_steps == 0:
        replayed = f", {sft.replay:g} of them replayed text" if sft.replay else ""
        raise ValueError(
            f"{manifest.path}: {manifest.rows('train')} training conversations, fewer than one"
            f" step of {rows_per_step} (train.batch_tokens / train.seq_len{replayed})"
        )
    warmup = math.ceil(sft.warmup_ratio * max_steps)
    return dataclasses.replace(
        tc, max_steps=max_steps, schedule=dataclasses.replace(tc.schedule, warmup_steps=warmup)
    )


def base_identity(path: str | Path) -> str:
    """The starting weights' identity: a checkpoint's settings hash and step, or the HF sha256."""
    path = Path(path)
    if (path / "meta.json").is_file():
        meta = json.loads((path / "meta.json").read_text())
        return f"run {meta['run']} settings {meta['settings_hash']} step {meta['step']}"
    files = hf_folder.safetensors_files(path)
    return "hf " + " ".join(f"{f.name} {sha256_file(f)}" for f in files)


def load_base(model: torch.nn.Module, path: str | Path) -> str:
    """Copy the base weights into the unsharded `model`; return their identity (for the hash).

    `path` is a final checkpoint (DCP + meta.json) or a Hugging Face folder that lmpipe.models
    imports. The base must have the run's shape: a mismatch names both.
    """
    path = Path(path)
    if (path / "meta.json").is_file():
        base, _ = load_final_checkpoint(path)
    elif model.config.arch == "hf":  # any causal LM folder: the model's own class reads it
        base = architecture("hf").load_hf(path)
    elif (path / "config.json").is_file():
        base = load_hf(path)
    else:
        raise FileNotFoundError(f"{path}: neither a final checkpoint nor a Hugging Face folder")
    if same_model(base.config) != same_model(model.config):
        raise ValueError(f"{path}: base model {base.config} is not the run's model {model.config}")
    model.load_state_dict(base.state_dict(), strict=True)
    return base_identity(path)


def same_model(config: Any) -> Any:
    """What a base must share with the run's model: all of its config, but an hf model's folder
    (a base is often another folder of the same model: an export, a copy)."""
    if config.arch != "hf":
        return config
    return dataclasses.replace(config, path="", revision=None)


def training_rows(
    job: TrainJob, tc: TrainConfig, manifest: Path, d: Dist, replay: Path | None
) -> tuple[Loader, Any]:
    """The loader of the training rows and their identity (for the settings hash): the
    conversations alone, or with `sft.replay` of each step's rows the base's text (`replay`:
    its tokens manifest, lmpipe.chat.replay). Each rank reads its share of the data-parallel
    group's rows."""
    x, y = load_split(manifest, "train")
    if x.shape[1] != tc.seq_len:
        raise ValueError(f"{manifest}: rows of {x.shape[1]} tokens, train.seq_len {tc.seq_len}")
    conversations = read_manifest(manifest).identity()
    if not job.sft.replay:
        if replay is not None:
            raise ValueError(f"--replay {replay}: runs.{job.run}.sft.replay is 0 (no replay)")
        loader = ConversationLoader(x, y, tc.micro_batch, tc.batch_tokens, d.group, tc.seed)
        return loader, conversations
    if replay is None:
        raise ValueError(
            f"runs.{job.run}.sft.replay {job.sft.replay:g}: needs --replay, the tokens manifest"
            " of the base's text"
        )
    text = text_sources(replay)
    loader = ReplayLoader(
        x, y, job.dataset, text, job.sft.replay, tc.micro_batch, tc.batch_tokens, d.group,
        tc.seed,
    )  # fmt: skip
    identity = {"conversations": conversations, "replay": job.sft.replay, "text": text.identity()}
    return loader, identity


def fine_tuning(
    job: TrainJob, manifest: Path, d: Dist, init: Path | None, replay: Path | None = None
) -> Task:
    if job.sft is None or init is None:
        raise ValueError(f"{job.run}: fine-tuning needs `sft:` settings and --init (the base)")
    tc = schedule(job.train, job.sft, read_manifest(manifest))
    loader, identity = training_rows(job, tc, manifest, d, replay)
    vx, vy = load_split(manifest, "val")
    val = conversation_val_batches(vx, vy, tc.micro_batch, tc.val_tokens, d.group)
    return Task(
        train=tc,
        loader=loader,
        val=val,
        data_identity=identity,
        init=lambda model: load_base(model, init),
        sparse_targets=True,  # conversations: ~3/4 of the targets are prompts and padding
        meta={"init": str(init)},
    )


def main(argv: list[str] | None = None) -> int:
    return worker_main(argv, fine_tuning, __doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
