"""A distributed loader over llm.c token shards, with a position that saves and restores exactly.

Like llm.c's DistributedDataLoader, ranks read consecutive slices of one token stream, but the
position moves a whole optimizer step at a time: a step reads `batch_tokens` consecutive tokens
(+1 for the last target) from one shard, micro-batch `i` of rank `r` being slice `i * W + r` of it.
So the tokens of each step do not depend on how they are split into ranks and micro-batches,
and 1 process with 2x the accumulation sees the same batches as 2 ranks. A step that would run
past the end of a shard starts at the next shard (wrapping around: another epoch).

The ranks are those of the data-parallel group (`dp`: the process group, lmpipe.train.parallel's
`Dist.group`, or a DataShare, which plays a rank without one): with a second mesh dimension, the
ranks that differ only in it read the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
import torch.distributed as dist

from lmpipe.data.shards import read_manifest, read_shard

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), (B, T) each; target -1: not counted


class Loader(Protocol):
    """What the trainer reads batches from: ShardLoader, ConversationLoader, Prefetcher."""

    micro: int  # micro-batches taken in the current step: 0 at a step boundary

    def next_batch(self) -> Batch: ...
    def state_dict(self) -> dict[str, Any]: ...  # the position, only valid between steps
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class DataShare(NamedTuple):
    """A process's place among the data-parallel ranks: its rank in the group, the group's size."""

    rank: int = 0
    size: int = 1


def share_of(dp: dist.ProcessGroup | DataShare) -> DataShare:
    """The share of the data-parallel group `dp` this process reads (a DataShare: itself)."""
    if isinstance(dp, DataShare):
        return dp
    return DataShare(dist.get_rank(dp), dist.get_world_size(dp))


def shard_files(manifest: str | Path, split: str) -> list[Path]:
    """The shard files of `split` ('train' or 'val') from a tokens manifest, in order."""
    return read_manifest(manifest).files(split)


class ShardLoader:
    """Micro-batches (x, y) of shape (B, T) for one rank; `state_dict()` between steps."""

    def __init__(
        self,
        files: list[Path],
        micro_batch: int,
        seq_len: int,
        batch_tokens: int,
        dp: dist.ProcessGroup | DataShare,
    ):
        self.files = files
        self.B, self.T = micro_batch, seq_len
        self.rank, self.world_size = share_of(dp)
        self.batch_tokens = batch_tokens
        self.micro_steps = batch_tokens // (micro_batch * seq_len * self.world_size)
        assert self.micro_steps * micro_batch * seq_len * self.world_size == batch_tokens
        self.shard, self.pos, self.micro = 0, 0, 0
        self._tokens = self._load(0)

    def _load(self, shard: int) -> np.ndarray:
        tokens = read_shard(self.files[shard])
        if len(tokens) < self.batch_tokens + 1:
            raise ValueError(
                f"{self.files[shard]}: {len(tokens)} tokens, fewer than one step of"
                f" train.batch_tokens {self.batch_tokens} + 1"
            )
        return tokens

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's next micro-batch; after the step's last one, move to the next step."""
        B, T = self.B, self.T
        start = self.pos + (self.micro * self.world_size + self.rank) * B * T
        buf = torch.from_numpy(self._tokens[start : start + B * T + 1].astype(np.int64))
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        self.micro += 1
        if self.micro == self.micro_steps:
            self.micro = 0
            self.pos += self.batch_tokens
            if self.pos + self.batch_tokens + 1 > len(self._tokens):
                shard = (self.shard + 1) % len(self.files)
                self._tokens = self._load(shard)  # first: a bad shard leaves the state as it was
                self.shard, self.pos = shard, 0
        return x, y

    def state_dict(self) -> dict[str, int]:
        """The position, identical on every rank; only valid at a step boundary."""
        assert self.micro == 0, "the loader position is saved between steps only"
        return {"shard": self.shard, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.shard, self.pos, self.micro = state["shard"], state["pos"], 0
        self._tokens = self._load(self.shard)


@dataclass
class ValSet:
    """This rank's share of the val text: its batches and, for every target, the document it
    belongs to and the UTF-8 bytes of text it spells (for bits per byte; None where the data
    has no byte table: conversations, or text tokenized before the table existed). Documents
    are numbered over all ranks' text, so that each rank's per-document sums add up, over the
    group, to the text's (lmpipe.eval.val_loss.Validation)."""

    batches: list[Batch]
    docs: list[torch.Tensor]  # (B, T) each, beside each batch's targets
    documents: int  # over all ranks
    target_bytes: list[torch.Tensor] | None = None  # (B, T) each: each target's bytes

    def __add__(self, other: ValSet) -> ValSet:
        """Two texts scored together (a mixture's sources): the second's documents after the
        first's; bytes only where both have them."""
        shifted = [d + self.documents for d in other.docs]
        both = self.target_bytes is not None and other.target_bytes is not None
        return ValSet(
            self.batches + other.batches,
            self.docs + shifted,
            self.documents + other.documents,
            self.target_bytes + other.target_bytes if both else None,  # type: ignore[operator]
        )


def documents_of(tokens: torch.Tensor, eot: int) -> torch.Tensor:
    """The document of each target of a token stream (target i follows input token i): a
    document starts at its end-of-text token, so predicting a document's closing end-of-text is
    that document's; text before the first end-of-text is document 0."""
    doc_of = torch.cumsum(tokens[:-1] == eot, 0)
    return doc_of - doc_of[0]


def target_bytes(tokens: torch.Tensor, token_bytes: np.ndarray | None) -> torch.Tensor | None:
    """The bytes of each target of a token stream (target i is token i + 1), by its id's entry
    in `token_bytes` (None: no table, no bytes)."""
    if token_bytes is None:
        return None
    return torch.from_numpy(token_bytes)[tokens[1:]]


def val_batches(
    file: Path,
    micro_batch: int,
    seq_len: int,
    val_tokens: int,
    dp: dist.ProcessGroup | DataShare,
    eot: int,
    token_bytes: np.ndarray | None = None,
) -> ValSet:
    """This rank's share (of the data-parallel group `dp`) of the first `val_tokens` tokens of
    the validation shard, in whole steps of every rank's micro-batch; `eot` opens a document;
    `token_bytes` (each id's bytes, lmpipe.data.token_bytes) gives each target's bytes."""
    rank, world_size = share_of(dp)
    tokens = read_shard(file)
    B, T = micro_batch, seq_len
    per_step = B * T * world_size
    steps = min(val_tokens, len(tokens) - 1) // per_step
    if steps == 0:
        raise ValueError(
            f"{file}: {len(tokens)} tokens, fewer than one validation batch of {per_step} + 1"
        )
    spans = [((i * world_size + rank) * B * T, B) for i in range(steps)]
    return val_set(tokens[: steps * per_step + 1], T, spans, eot, token_bytes)


def val_set(
    tokens: np.ndarray,
    seq_len: int,
    spans: list[tuple[int, int]],
    eot: int,
    token_bytes: np.ndarray | None = None,
) -> ValSet:
    """The batches of `spans` (each a first token and a number of rows of `seq_len`) of the
    scored val text `tokens`, each target's document numbered over the whole text (`eot` opens
    one) and, with `token_bytes`, its bytes: what `val_batches` (a rank's share) and the val_loss
    evaluation (every sequence) score."""
    T = seq_len
    scored = torch.from_numpy(tokens.astype(np.int64))
    doc_of = documents_of(scored, eot)
    bytes_of = target_bytes(scored, token_bytes)
    batches, docs, byts = [], [], []
    for start, rows in spans:
        # a batch's own storage, of rows * T + 1 tokens as a training batch's: a compiled model
        # guards on the size of its input's base, and a view into the whole val text would
        # make the training graph dynamic
        buf = scored[start : start + rows * T + 1].clone()
        batches.append((buf[:-1].view(rows, T), buf[1:].view(rows, T)))
        docs.append(doc_of[start : start + rows * T].view(rows, T))
        if bytes_of is not None:
            byts.append(bytes_of[start : start + rows * T].view(rows, T))
    return ValSet(batches, docs, int(doc_of[-1]) + 1, byts if bytes_of is not None else None)
