"""Replay of pretraining text during fine-tuning (`sft.replay`): a share of each step's rows are
plain LM rows of the base's pretraining text, the loss on every token, the others conversations
masked as usual. Fine-tuning a small model on a few hundred conversations for many steps
otherwise trains away what pretraining taught (its val loss on the text climbs above an
untrained model's); a little of the old data in every step keeps it.

How a step is drawn: a step's `batch_tokens / seq_len` rows are drawn as a mixture's are
(lmpipe.data.mixture.draw_rows), from the conversations at weight `1 - replay` and the text at
`replay` (a mixture's sources each at `replay` times its weight): row `g` of the run goes to the
source furthest below its share, so the rows of a step depend only on the step, never on the
ranks, the micro-batches or a restart. The conversations are one stream of rows, each epoch a
permutation from (seed, epoch) (lmpipe.chat.loader.epoch_order), read on across the epochs'
ends; the text's rows are consecutive `seq_len`-token windows of its train shards
(lmpipe.data.mixture_loader.SourceStream), targets the next tokens. The step's rows keep the
order they were drawn in, and rank `r`'s micro-batch `i` is rows `(i * W + r) * B ...` of them,
as every loader slices a step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lmpipe.chat.loader import epoch_order
from lmpipe.data.loader import Batch, DataShare, share_of
from lmpipe.data.mixture import Mixture, draw_rows
from lmpipe.data.mixture_loader import SourceStream
from lmpipe.data.shards import read_header


class ConversationStream:
    """The training conversations as a stream of rows, epoch after epoch."""

    def __init__(self, inputs: np.ndarray, targets: np.ndarray, seed: int):
        self.inputs, self.targets, self.seed = inputs, targets, seed
        self.epoch, self.pos = 0, 0
        self._order = epoch_order(len(inputs), seed, 0)

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next `n` rows (inputs, targets), into the next epoch's order where this one ends."""
        rows = []
        while n > 0:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = epoch_order(len(self.inputs), self.seed, self.epoch)
            k = min(n, len(self._order) - self.pos)
            rows.append(self._order[self.pos : self.pos + k])
            self.pos, n = self.pos + k, n - k
        picked = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        return self.inputs[picked], self.targets[picked]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = epoch_order(len(self.inputs), self.seed, self.epoch)


class ReplayLoader:
    """Micro-batches (x, y) of shape (B, T) for one rank, conversations and replayed text mixed
    in each step (the Loader protocol of lmpipe.data.loader); `state_dict()` between steps."""

    def __init__(
        self,
        inputs: np.ndarray,
        targets: np.ndarray,
        conversations: str,
        text: Mixture,
        replay: float,
        micro_batch: int,
        batch_tokens: int,
        dp: dist.ProcessGroup | DataShare,
        seed: int,
    ):
        self.B, self.T = micro_batch, inputs.shape[1]
        self.rank, self.world_size = share_of(dp)
        self.rows = batch_tokens // self.T  # a step's rows, over all ranks and micro-batches
        self.micro_steps = self.rows // (micro_batch * self.world_size)
        assert self.micro_steps * micro_batch * self.world_size * self.T == batch_tokens
        self.conversations = ConversationStream(inputs, targets, seed)
        self.streams = [SourceStream(s.name, s.tokens.files("train")) for s in text.sources]
        self.names = [conversations] + [s.name for s in text.sources]
        self.weights = [1 - replay] + [replay * s.weight for s in text.sources]
        self.sizes = [len(inputs) * self.T] + [
            sum(read_header(f) for f in s.tokens.files("train")) for s in text.sources
        ]  # each source's train tokens: its epochs
        self.taken = [0] * len(self.names)  # rows each source has given, over the run
        self.micro = 0
        self._step: tuple[np.ndarray, np.ndarray] | None = None

    def _draw_step(self) -> tuple[np.ndarray, np.ndarray]:
        """The step's rows (inputs, targets), (rows, T) each, in the order they were drawn."""
        drawn = np.array(draw_rows(self.weights, self.taken, self.rows))
        x = np.empty((self.rows, self.T), dtype=np.int64)
        y = np.empty((self.rows, self.T), dtype=np.int64)
        mine = drawn == 0
        x[mine], y[mine] = self.conversations.take(int(mine.sum()))
        for k, stream in enumerate(self.streams, start=1):
            mine = drawn == k
            if not mine.any():
                continue
            n = int(mine.sum())
            block = stream.take(n * self.T)  # n * T + 1 consecutive tokens
            windows = np.lib.stride_tricks.sliding_window_view(block, self.T + 1)[:: self.T]
            x[mine], y[mine] = windows[:, :-1], windows[:, 1:]  # every target counts
        return x, y

    def next_batch(self) -> Batch:
        """This rank's next micro-batch; the step's rows are drawn at its first."""
        if self.micro == 0:
            self._step = self._draw_step()
        x, y = self._step
        first = (self.micro * self.world_size + self.rank) * self.B
        rows = slice(first, first + self.B)
        self.micro = (self.micro + 1) % self.micro_steps
        return torch.from_numpy(x[rows].copy()), torch.from_numpy(y[rows].copy())

    def state_dict(self) -> dict[str, Any]:
        """The position (the conversations' and each text source's, the rows each has given),
        identical on every rank, with the tokens and epochs each source has given: only valid
        at a step boundary."""
        assert self.micro == 0, "the loader position is saved between steps only"
        pairs = list(zip(self.names, self.taken, self.sizes, strict=True))
        return {
            "taken": {n: t for n, t, _ in pairs},
            "conversations": self.conversations.state_dict(),
            "streams": {s.name: s.state_dict() for s in self.streams},
            "tokens_by_source": {n: t * self.T for n, t, _ in pairs},
            "epochs_by_source": {n: t * self.T / size for n, t, size in pairs},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.taken = [state["taken"][n] for n in self.names]
        self.conversations.load_state_dict(state["conversations"])
        for s in self.streams:
            s.load_state_dict(state["streams"][s.name])
        self.micro = 0
