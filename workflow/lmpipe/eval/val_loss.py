"""Validation loss: one scoring (`score`) for the model as it trains (lmpipe.train.loop, on
this rank's share of the val text, summed over the ranks) and for a converted model after
(`evaluate`, the `val_loss` evaluation: llm.c's val loader's sequences; a mixture's: each
source's and their mean by its weights). Both keep each document's summed loss and tokens,
which the report's intervals are computed over (lmpipe.stats), and, where the data has a byte
table (lmpipe.data.token_bytes), the UTF-8 bytes its counted targets spell and the loss in bits
per byte: the summed loss over the bytes, over ln 2, as nanochat's `evaluate_bpb`
(karpathy/nanochat, `nanochat/loss_eval.py`) measures it, and comparable across tokenizers.

One choice differs from nanochat's: the loss summed is the val loss's own, over every counted
target, the end of text that closes a document included (0 bytes, but its nats are the cost of
saying where a document ends, which any coder of the text pays too); nanochat leaves 0-byte
targets out. So bits per byte here is exactly `loss * tokens / (bytes * ln 2)` of the same
result, and the report can recompute one from the other."""

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

from lmpipe.data.loader import ValSet, val_set
from lmpipe.data.mixture import is_mixture, read_mixture
from lmpipe.data.shards import GPT2_EOT, TokensManifest, read_header, read_manifest, read_shard
from lmpipe.eval.results import produced_by
from lmpipe.models import load_hf
from lmpipe.registry import ValLossSettings
from lmpipe.stats import cluster_stderr

# at most this many bytes of fp32 logits a forward (GPT-2 124M: 5 rows of 1,024 tokens)
LOGITS_BYTES = 2**30


def val_shard(manifest: TokensManifest) -> Path:
    val = manifest.files("val")
    if len(val) != 1:
        raise ValueError(f"{manifest.path}: expected one val shard, found {len(val)}")
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
    bytes: int | None = None  # the UTF-8 bytes the counted targets spell (None: no byte table)
    doc_bytes: list[int] | None = None

    @property
    def bits_per_byte(self) -> float | None:
        """The summed loss in bits over the bytes; None without bytes."""
        if not self.bytes:
            return None
        return bits_per_byte(self.loss, self.tokens, self.bytes)


def bits_per_byte(loss: float, tokens: int, n_bytes: int) -> float:
    """A mean loss in nats per token over `tokens` targets as bits per byte of their text."""
    return loss * tokens / (n_bytes * math.log(2))


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
    """Each document's summed loss, counted targets and (with `with_bytes`) the bytes those
    targets spell, added batch by batch (on the model's device, in fp64 and int64)."""

    def __init__(self, documents: int, device: torch.device | str, with_bytes: bool = False):
        self.loss = torch.zeros(documents, dtype=torch.float64, device=device)
        self.tokens = torch.zeros(documents, dtype=torch.int64, device=device)
        self.bytes = torch.zeros_like(self.tokens) if with_bytes else None

    def add(
        self,
        losses: torch.Tensor,
        targets: torch.Tensor,
        docs: torch.Tensor,
        target_bytes: torch.Tensor | None = None,
    ) -> None:
        counted = (targets != -1).flatten()
        docs = docs.flatten()
        self.loss.index_add_(0, docs, losses.flatten().double() * counted)
        self.tokens.index_add_(0, docs, counted.long())
        if self.bytes is not None:
            assert target_bytes is not None, "sums with bytes need each target's bytes"
            self.bytes.index_add_(0, docs, target_bytes.flatten().long() * counted)

    def scored(self) -> Scored:
        """The sums as a Scored; documents with no counted target are left out."""
        loss, tokens = self.loss.cpu(), self.tokens.cpu()  # a host sync
        kept = tokens > 0
        total = int(tokens.sum())
        s = Scored(loss.sum().item() / total, total, loss[kept].tolist(), tokens[kept].tolist())
        if self.bytes is not None:
            n_bytes = self.bytes.cpu()
            s.bytes, s.doc_bytes = int(n_bytes.sum()), n_bytes[kept].tolist()
        return s


@torch.no_grad()
def score(
    model: torch.nn.Module, val: ValSet, device: torch.device | str, group: Any = None
) -> Scored:
    """The val text's loss: each rank scores its share of `val` and the per-document sums are
    added over the data-parallel `group` (None: one process). The one scoring of val loss, as
    the model trains (lmpipe.train.loop) and after (`val_loss` below); with the bytes of the
    counted targets where `val` has them (bits per byte)."""
    sums = DocumentSums(val.documents, device, with_bytes=val.target_bytes is not None)
    byts = val.target_bytes if val.target_bytes is not None else [None] * len(val.batches)
    pairs = zip(val.batches, val.docs, byts, strict=True)
    shown = group is None  # a progress bar after training; the train log has its own lines
    for (x, y), docs, b in tqdm(
        pairs, "val loss", len(val.batches), unit="batch", disable=not shown
    ):
        y = y.to(device)
        b = b.to(device) if b is not None else None
        sums.add(token_losses(model, x.to(device), y), y, docs.to(device), b)
    if group is not None:
        dist.all_reduce(sums.loss, group=group)  # SUM
        dist.all_reduce(sums.tokens, group=group)
        if sums.bytes is not None:
            dist.all_reduce(sums.bytes, group=group)
    return sums.scored()


def val_loss(
    model: torch.nn.Module,
    shard: str | Path,
    val_tokens: int,
    batch: int,
    device: str = "cpu",
    eot: int = GPT2_EOT,
    token_bytes: np.ndarray | None = None,
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
    spans = [(start * T, min(batch, n_seq - start)) for start in range(0, n_seq, batch)]
    val = val_set(tokens[: n_seq * T + 1], T, spans, eot, token_bytes)
    return score(model, val, device)


def score_shard(
    model: torch.nn.Module,
    shard: Path,
    settings: ValLossSettings,
    device: str,
    eot: int,
    token_bytes: np.ndarray | None = None,
) -> dict[str, Any]:
    """One val shard's loss, with each document's summed loss and tokens in the shard's order,
    and the mean's standard error over documents (cluster-robust); the bytes scored and bits
    per byte (None where the data has no byte table: tokenized before it existed)."""
    s = val_loss(model, shard, settings.tokens, settings.batch, device, eot, token_bytes)
    return {
        "value": s.loss,
        "tokens": s.tokens,
        "bytes": s.bytes,
        "bits_per_byte": s.bits_per_byte,
        "stderr": cluster_stderr(s.doc_losses, s.doc_tokens),
        "documents": len(s.doc_tokens),
        "doc_losses": s.doc_losses,
        "doc_tokens": s.doc_tokens,
        **({"doc_bytes": s.doc_bytes} if s.doc_bytes is not None else {}),
    }


def evaluate(
    settings: ValLossSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    """The val loss on the dataset's val shard; a mixture's: on each source's val shard
    (`sources`, `settings.tokens` each, or all a smaller shard holds) and their mean by the
    mixture's weights (`value`; `bits_per_byte` likewise the weighted mean of the sources', as
    the loss is, and None unless every source has one; `bytes` their sum)."""
    model = load_hf(model_dir).to(device)
    manifest = inputs["tokens"]
    how = "mean next-token cross-entropy"
    if not is_mixture(manifest):
        m = read_manifest(manifest)
        shard = val_shard(m)
        return {
            "metric": "fineweb_val_loss",
            "dataset": m.dataset,
            # an `arch: hf` model's own tokens (None: GPT-2's): losses pair only on equal tokens
            **({"tokens_of": m.tokens_of} if m.tokens_of else {}),
            **score_shard(model, shard, settings, device, m.eot, m.byte_table()),
            "produced_by": produced_by(__name__, model_dir, how, shard=str(shard), device=device),
        }
    mixture = read_mixture(manifest)
    sources, shards = {}, []
    for s in mixture.sources:
        shard = val_shard(s.tokens)
        shards.append(str(shard))
        # a small source's val shard may hold fewer tokens than asked: all of it is scored
        capped = replace(settings, tokens=min(settings.tokens, read_header(shard) - 1))
        sources[s.name] = {"dataset": s.name, "weight": s.weight}
        table = s.tokens.byte_table()  # each source's own
        sources[s.name] |= score_shard(model, shard, capped, device, s.tokens.eot, table)
    weighted = [(r["weight"], r) for r in sources.values()]
    bpbs = [r["bits_per_byte"] for r in sources.values()]
    byts = [r["bytes"] for r in sources.values()]
    tokens_of = mixture.sources[0].tokens.tokens_of  # the sources' (one model's for all)
    return {
        "metric": "fineweb_val_loss",
        "dataset": mixture.name,
        **({"tokens_of": tokens_of} if tokens_of else {}),
        "value": sum(w * r["value"] for w, r in weighted),
        "tokens": sum(r["tokens"] for r in sources.values()),
        "bytes": None if None in byts else sum(byts),
        "bits_per_byte": None if None in bpbs else sum(w * r["bits_per_byte"] for w, r in weighted),
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
