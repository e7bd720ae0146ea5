"""FineWeb validation loss of a converted model, as llm.c's val loader computes it (a
mixture's: each source's and their mean by its weights)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from lmpipe.data.mixture import is_mixture, read_mixture
from lmpipe.data.shards import read_header, read_manifest, read_shard
from lmpipe.eval.results import produced_by
from lmpipe.files import read_json
from lmpipe.models import load_hf
from lmpipe.registry import ValLossSettings
from lmpipe.stats import cluster_stderr

GPT2_EOT = 50256  # <|endoftext|>: a tokens manifest without "eot" is GPT-2's


def val_shard(manifest_path: str | Path) -> Path:
    val = read_manifest(manifest_path).files("val")
    if len(val) != 1:
        raise ValueError(f"{manifest_path}: expected one val shard, found {len(val)}")
    return val[0]


@dataclass
class Scored:
    """A val shard's scored tokens: the mean loss, and each document's summed loss and tokens
    (a document starts at its end-of-text token; a target belongs to the document of the token
    it follows, so predicting a document's closing end-of-text is that document's)."""

    loss: float
    tokens: int
    doc_losses: list[float]
    doc_tokens: list[int]


@torch.no_grad()
def val_loss(
    model: torch.nn.Module,
    shard: str | Path,
    val_tokens: int,
    batch: int,
    device: str = "cpu",
    eot: int = GPT2_EOT,
) -> Scored:
    """Mean next-token loss over the first `val_tokens` of the val shard, as llm.c's val loader:
    non-overlapping sequences of block_size tokens, targets shifted by one; with each document's
    summed loss (the report's interval over documents: a token's loss is correlated with its
    neighbours', a document's with no other's)."""
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
    scored = torch.from_numpy(tokens[: n_seq * T + 1].astype(np.int64))
    # the document of each target (position 1..n): end-of-text tokens before it, exclusive
    doc_of = torch.cumsum(scored[:-1] == eot, 0)
    doc_of -= doc_of[0].item()  # a shard that does not open with end-of-text: its text is doc 0
    per_token = torch.empty(n_seq * T, dtype=torch.float64)
    for start in tqdm(range(0, n_seq, batch), desc="val loss", unit="batch"):
        b = min(batch, n_seq - start)
        buf = scored[start * T : (start + b) * T + 1]
        x, y = buf[:-1].view(b, T).to(device), buf[1:].view(b, T).to(device)
        logits, _ = model(x)  # (b, T, V) fp32
        losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
        per_token[start * T : (start + b) * T] = losses.double().cpu()  # a host sync a batch
    docs = int(doc_of[-1].item()) + 1
    sums = torch.zeros(docs, dtype=torch.float64).index_add_(0, doc_of, per_token)
    counts = torch.bincount(doc_of, minlength=docs)
    return Scored(per_token.mean().item(), n_seq * T, sums.tolist(), counts.tolist())


def score_shard(
    model: torch.nn.Module, shard: Path, settings: ValLossSettings, device: str, eot: int
) -> dict[str, Any]:
    """One val shard's loss, with each document's summed loss and tokens in the shard's order,
    and the mean's standard error over documents (cluster-robust)."""
    s = val_loss(model, shard, settings.tokens, settings.batch, device, eot)
    return {
        "value": s.loss,
        "tokens": s.tokens,
        "stderr": cluster_stderr(s.doc_losses, s.doc_tokens),
        "documents": len(s.doc_tokens),
        "doc_losses": s.doc_losses,
        "doc_tokens": s.doc_tokens,
    }


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
            **score_shard(model, shard, settings, device, tokens.get("eot", GPT2_EOT)),
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
        eot = read_json(Path(s.tokens.path), "tokens manifest").get("eot", GPT2_EOT)
        sources[s.name] |= score_shard(model, shard, capped, device, eot)
    weighted = [(r["weight"], r) for r in sources.values()]
    return {
        "metric": "fineweb_val_loss",
        "dataset": mixture.name,
        "value": sum(w * r["value"] for w, r in weighted),
        "tokens": sum(r["tokens"] for r in sources.values()),
        # the sources are scored apart: the weighted mean's standard error from theirs (none
        # where a source's val text is one document, which gives no spread to measure)
        "stderr": None
        if any(r["stderr"] is None for _, r in weighted)
        else math.sqrt(sum((w * r["stderr"]) ** 2 for w, r in weighted)),
        "sources": sources,
        "produced_by": produced_by(
            __name__,
            model_dir,
            f"{how}, each source's val shard, weighted by the mixture",
            shards=shards,
            device=device,
        ),  # fmt: skip
    }
