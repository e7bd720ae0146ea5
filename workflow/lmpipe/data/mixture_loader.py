"""The mixture's loader: each step's rows drawn from its sources (lmpipe.data.mixture says how)
and its val batches. Apart from lmpipe.data.mixture, whose manifest the data rules write without
torch."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lmpipe.data.loader import Batch, DataShare, ValSet, share_of, val_batches
from lmpipe.data.mixture import Mixture, draw_rows
from lmpipe.data.shards import read_header, read_shard

log = logging.getLogger("lmpipe.mixture")


class SourceStream:
    """One source's train shards as a stream of blocks of consecutive tokens, in epochs."""

    def __init__(self, name: str, files: list[Path]):
        self.name, self.files = name, files
        self.shard, self.pos, self.epoch = 0, 0, 0
        self._tokens = read_shard(files[0])

    def take(self, n: int) -> np.ndarray:
        """The next `n` tokens + 1 (the last target) from one shard; the next shard (or the
        first again: a new epoch) when the current one has too few left."""
        if self.pos + n + 1 > len(self._tokens):
            shard = (self.shard + 1) % len(self.files)
            tokens = read_shard(self.files[shard])
            if n + 1 > len(tokens):
                raise ValueError(
                    f"{self.files[shard]}: {len(tokens)} tokens, fewer than one step's {n + 1}"
                    f" of source {self.name!r}"
                )
            if shard == 0:
                self.epoch += 1
                log.info("source %s: epoch %d begins (its train shards again)", self.name,
                         self.epoch + 1)  # fmt: skip
            self._tokens, self.shard, self.pos = tokens, shard, 0
        block = self._tokens[self.pos : self.pos + n + 1]
        self.pos += n
        return block

    def state_dict(self) -> dict[str, int]:
        return {"shard": self.shard, "pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.shard, self.pos, self.epoch = state["shard"], state["pos"], state["epoch"]
        self._tokens = read_shard(self.files[self.shard])


class MixtureLoader:
    """Micro-batches (x, y) of shape (B, T) for one rank from a mixture's sources (the Loader
    protocol of lmpipe.data.loader); `state_dict()` between steps."""

    def __init__(
        self,
        mixture: Mixture,
        micro_batch: int,
        seq_len: int,
        batch_tokens: int,
        dp: dist.ProcessGroup | DataShare,
    ):
        self.B, self.T = micro_batch, seq_len
        self.rank, self.world_size = share_of(dp)
        self.rows = batch_tokens // seq_len  # a step's rows, over all ranks and micro-batches
        self.micro_steps = batch_tokens // (micro_batch * seq_len * self.world_size)
        assert self.micro_steps * micro_batch * seq_len * self.world_size == batch_tokens
        self.names = [s.name for s in mixture.sources]
        self.weights = [s.weight for s in mixture.sources]
        self.streams = [SourceStream(s.name, s.tokens.files("train")) for s in mixture.sources]
        self.train_tokens = [
            sum(read_header(f) for f in s.tokens.files("train")) for s in mixture.sources
        ]
        self.taken = [0] * len(self.streams)  # rows each source has given, over the run
        self.micro = 0
        self._step_rows: list[np.ndarray] = []

    def _draw_step(self) -> list[np.ndarray]:
        """The step's rows (seq_len + 1 tokens each), in the order they were drawn."""
        drawn = draw_rows(self.weights, self.taken, self.rows)
        blocks = [s.take(drawn.count(k) * self.T) for k, s in enumerate(self.streams)]
        used = [0] * len(self.streams)
        rows = []
        for k in drawn:
            start = used[k] * self.T
            rows.append(blocks[k][start : start + self.T + 1])
            used[k] += 1
        return rows

    def next_batch(self) -> Batch:
        """This rank's next micro-batch; the step's rows are drawn at its first."""
        if self.micro == 0:
            self._step_rows = self._draw_step()
        first = (self.micro * self.world_size + self.rank) * self.B
        buf = np.stack(self._step_rows[first : first + self.B]).astype(np.int64)
        x, y = torch.from_numpy(buf[:, :-1].copy()), torch.from_numpy(buf[:, 1:].copy())
        self.micro = (self.micro + 1) % self.micro_steps
        return x, y

    def state_dict(self) -> dict[str, Any]:
        """The position (each source's stream and rows taken), identical on every rank, with
        the tokens and epochs each source has given: only valid at a step boundary."""
        assert self.micro == 0, "the loader position is saved between steps only"
        return {
            "taken": dict(zip(self.names, self.taken, strict=True)),
            "streams": {n: s.state_dict() for n, s in zip(self.names, self.streams, strict=True)},
            "tokens_by_source": {
                n: t * self.T for n, t in zip(self.names, self.taken, strict=True)
            },
            "epochs_by_source": {
                n: t * self.T / total
                for n, t, total in zip(self.names, self.taken, self.train_tokens, strict=True)
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.taken = [state["taken"][n] for n in self.names]
        for n, s in zip(self.names, self.streams, strict=True):
            s.load_state_dict(state["streams"][n])
        self.micro = 0


def mixture_val_batches(
    mixture: Mixture,
    micro_batch: int,
    seq_len: int,
    val_tokens: int,
    dp: dist.ProcessGroup | DataShare,
) -> ValSet:
    """This rank's share of each source's val shard, `val_tokens` split by the weights (at
    least one batch a source): the mean over them is the mixture's val loss."""
    per_batch = micro_batch * seq_len * share_of(dp).size
    val = ValSet([], [], 0)
    for s in mixture.sources:
        tokens = max(per_batch, round(val_tokens * s.weight / per_batch) * per_batch)
        file = s.tokens.files("val")[0]
        table = s.tokens.byte_table()  # each source its own
        val += val_batches(file, micro_batch, seq_len, tokens, dp, s.tokens.eot, table)
    return val
