"""FineWeb validation loss of a converted model, as llm.c's val loader computes it (a
mixture's: each source's and their mean by its weights)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from lmpipe.data.mixture import is_mixture, read_mixture
from lmpipe.data.shards import read_header, read_manifest, read_shard
from lmpipe.eval.results import mean_stderr, produced_by
from lmpipe.files import read_json
from lmpipe.models import load_hf
from lmpipe.registry import ValLossSettings


def val_shard(manifest_path: str | Path) -> Path:
    val = read_manifest(manifest_path).files("val")
    if len(val) != 1:
        raise ValueError(f"{manifest_path}: expected one val shard, found {len(val)}")
    return val[0]


@torch.no_grad()
def val_loss(
    model: torch.nn.Module,
    shard: str | Path,
    val_tokens: int,
    batch: int,
    device: str = "cpu",
    batch_losses: list[float] | None = None,
) -> tuple[float, int]:
    """Mean next-token loss over the first `val_tokens` of the val shard, as llm.c's val loader:
    non-overlapping sequences of block_size tokens, targets shifted by one. Each batch's mean
    loss is appended to `batch_losses` when given (the report's standard error, and its paired
    comparison of two runs over the same batches).

    Returns (loss, tokens scored)."""
    T = model.config.block_size
    tokens = read_shard(shard)
    n_seq = val_tokens // T
    if n_seq == 0:
        raise ValueError(f"eval.val_loss.tokens {val_tokens} is below one sequence of {T} tokens")
    if n_seq * T + 1 > len(tokens):
        raise ValueError(
            f"{shard}: {len(tokens):,} tokens, fewer than the {n_seq * T + 1:,} that"
            f" eval.val_loss.tokens {val_tokens:,} needs"
        )
    total = 0.0
    for start in tqdm(range(0, n_seq, batch), desc="val loss", unit="batch"):
        b = min(batch, n_seq - start)
        buf = torch.from_numpy(tokens[start * T : (start + b) * T + 1].astype(np.int64))
        x, y = buf[:-1].view(b, T).to(device), buf[1:].view(b, T).to(device)
        _, loss = model(x, y)
        mean = loss.item()  # a host sync a batch: fine for an eval
        total += mean * b * T
        if batch_losses is not None:
            batch_losses.append(mean)
    return total / (n_seq * T), n_seq * T


def score_shard(
    model: torch.nn.Module, shard: Path, settings: ValLossSettings, device: str
) -> dict[str, Any]:
    """One val shard's loss, with each batch's mean loss in the shard's order (settings.batch
    sequences a batch, the last maybe fewer) and their standard error."""
    batches: list[float] = []
    loss, tokens = val_loss(model, shard, settings.tokens, settings.batch, device, batches)
    return {
        "value": loss, "tokens": tokens, "batch_losses": batches, "stderr": mean_stderr(batches),
    }  # fmt: skip


def evaluate(
    settings: ValLossSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    """The val loss on the dataset's val shard; a mixture's: on each source's val shard
    (`sources`, `settings.tokens` each, or all a smaller shard holds) and their mean by the
    mixture's weights (`value`)."""
    model = load_hf(model_dir).to(device)
    manifest = inputs["tokens"]
    how = "mean next-token cross-entropy"
    if not is_mixture(manifest):
        shard = val_shard(manifest)
        tokens = read_json(Path(manifest), "tokens manifest")
        return {
            "metric": "fineweb_val_loss",
            "dataset": tokens.get("dataset"),
            # an `arch: hf` model's own tokens (None: GPT-2's): losses pair only on equal tokens
            **({"tokens_of": tokens["tokens_of"]} if tokens.get("tokens_of") else {}),
            **score_shard(model, shard, settings, device),
            "produced_by": produced_by(__name__, model_dir, how, shard=str(shard), device=device),
        }
    mixture = read_mixture(manifest)
    sources, shards = {}, []
    for s in mixture.sources:
        shard = val_shard(s.tokens.path)
        shards.append(str(shard))
        # a small source's val shard may hold fewer tokens than asked: all of it is scored
        capped = replace(settings, tokens=min(settings.tokens, read_header(shard) - 1))
        sources[s.name] = {"dataset": s.name, "weight": s.weight}
        sources[s.name] |= score_shard(model, shard, capped, device)
    weighted = [(r["weight"], r) for r in sources.values()]
    return {
        "metric": "fineweb_val_loss",
        "dataset": mixture.name,
        "value": sum(w * r["value"] for w, r in weighted),
        "tokens": sum(r["tokens"] for r in sources.values()),
        # the sources' batches are scored apart: the weighted mean's standard error from theirs
        "stderr": math.sqrt(sum((w * r["stderr"]) ** 2 for w, r in weighted)),
        "sources": sources,
        "produced_by": produced_by(
            __name__,
            model_dir,
            f"{how}, each source's val shard, weighted by the mixture",
            shards=shards,
            device=device,
        ),  # fmt: skip
    }
