"""Validation loss: one scoring (`score`) for the model as it trains (lmpipe.train.loop, on
this rank's share of the val text, summed over the ranks) and for a converted model after
(`evaluate`, the `val_loss` evaluation: llm.c's val loader's sequences; a mixture's: each
source's and their mean by its weights). Both keep each document's summed loss and tokens,
which the report's intervals are computed over (lmpipe.stats)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from lmpipe.data.loader import ValSet, documents_of
from lmpipe.data.mixture import is_mixture, read_mixture
from lmpipe.data.shards import GPT2_EOT, read_header, read_manifest, read_shard
from lmpipe.eval.results import produced_by
from lmpipe.files import read_json
from lmpipe.models import load_hf
from lmpipe.registry import ValLossSettings
from lmpipe.stats import cluster_stderr

# at most this many bytes of fp32 logits a forward (GPT-2 124M: 5 rows of 1,024 tokens)
LOGITS_BYTES = 2**30


def val_shard(manifest_path: str | Path) -> Path:
    val = read_manifest(manifest_path).files("val")
    if len(val) != 1:
        raise ValueError(f"{manifest_path}: expected one val shard, found {len(val)}")
    return val[0]


@dataclass
class Scored:
    """Scored val text: the mean loss over its counted targets, and each document's summed loss
    and counted targets (a document starts at its end-of-text token; a target belongs to the
    document of the token it follows, so predicting a document's closing end-of-text is that
    document's: lmpipe.data.loader.documents_of)."""

    loss: float
    tokens: int
    doc_losses: list[float]
    doc_tokens: list[int]


def rows_per_forward(rows: int, seq_len: int, vocab_size: int) -> int:
    """The most rows of a batch a forward takes: the largest divisor of `rows` whose fp32
    logits fit LOGITS_BYTES (a divisor: every forward has one shape, so a compiled model
    compiles one graph for it)."""
    fit = max(1, LOGITS_BYTES // (seq_len * vocab_size * 4))
    return max(d for d in range(1, min(rows, fit) + 1) if rows % d == 0)


def token_losses(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each target's next-token loss (0 where the target is -1, not counted), (B, T) fp32,
    from the model's logits a few rows at a time (rows_per_forward)."""
    B, T = x.shape
    step = rows_per_forward(B, T, model.config.vocab_size)
    losses = []
    for r in range(0, B, step):
        torch.compiler.cudagraph_mark_step_begin()  # (CUDA graphs: a new replay; else a no-op)
        logits, _ = model(x[r : r + step])  # (rows, T, V) fp32
        targets = y[r : r + step].flatten()
        losses.append(
            F.cross_entropy(logits.flatten(0, 1), targets, ignore_index=-1, reduction="none")
        )
    return torch.cat(losses).view(B, T)


class DocumentSums:
    """Each document's summed loss and counted targets, added batch by batch (on the model's
    device, in fp64)."""

    def __init__(self, documents: int, device: torch.device | str):
        self.loss = torch.zeros(documents, dtype=torch.float64, device=device)
        self.tokens = torch.zeros(documents, dtype=torch.int64, device=device)

    def add(self, losses: torch.Tensor, targets: torch.Tensor, docs: torch.Tensor) -> None:
        counted = (targets != -1).flatten()
        docs = docs.flatten()
        self.loss.index_add_(0, docs, losses.flatten().double() * counted)
        self.tokens.index_add_(0, docs, counted.long())

    def scored(self) -> Scored:
        """The sums as a Scored; documents with no counted target are left out."""
        loss, tokens = self.loss.cpu(), self.tokens.cpu()  # a host sync
        kept = tokens > 0
        total = int(tokens.sum())
        return Scored(loss.sum().item() / total, total, loss[kept].tolist(), tokens[kept].tolist())


@torch.no_grad()
def score(
    model: torch.nn.Module, val: ValSet, device: torch.device | str, group: Any = None
) -> Scored:
    """The val text's loss: each rank scores its share of `val` and the per-document sums are
    added over the data-parallel `group` (None: one process). The one scoring of val loss, as
    the model trains (lmpipe.train.loop) and after (`val_loss` below)."""
    sums = DocumentSums(val.documents, device)
    pairs = zip(val.batches, val.docs, strict=True)
    shown = group is None  # a progress bar after training; the train log has its own lines
    for (x, y), docs in tqdm(pairs, "val loss", len(val.batches), unit="batch", disable=not shown):
        y = y.to(device)
        sums.add(token_losses(model, x.to(device), y), y, docs.to(device))
    if group is not None:
        dist.all_reduce(sums.loss, group=group)  # SUM
        dist.all_reduce(sums.tokens, group=group)
    return sums.scored()


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
    doc_of = documents_of(scored, eot)
    batches, docs = [], []
    for start in range(0, n_seq, batch):
        b = min(batch, n_seq - start)
        buf = scored[start * T : (start + b) * T + 1]
        batches.append((buf[:-1].view(b, T), buf[1:].view(b, T)))
        docs.append(doc_of[start * T : (start + b) * T].view(b, T))
    val = ValSet(batches, docs, int(doc_of[-1]) + 1)
    return score(model, val, device)


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
            **score_shard(model, shard, settings, device, read_manifest(manifest).eot),
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
        sources[s.name] |= score_shard(model, shard, capped, device, s.tokens.eot)
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
