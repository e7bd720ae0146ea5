"""Reading conversation rows (what lmpipe.chat.data writes), and loaders over them with
ShardLoader's interface: the trainer reads them as it reads token shards.

`read_manifest` is the one reader of the conversations manifest (the fine-tuning worker, the
held-out loss, `load_split` below)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from lmpipe import manifests
from lmpipe.data.loader import DataShare, ValSet, share_of

# the conversations manifest's reader and types are lmpipe.manifests'; named here as the chat
# stage has always named them
ManifestArray = manifests.ManifestArray
ConversationsManifest = manifests.ConversationsManifest
read_manifest = manifests.read_conversations


def load_split(manifest_path: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of `split` from an SFT manifest; shapes and files checked."""
    m = read_manifest(manifest_path)
    arrays = {}
    for a in m.arrays:
        if a.split == split:
            try:
                arrays[a.array] = np.load(a.file, allow_pickle=False)
            except (ValueError, EOFError) as e:  # truncated, or not an .npy array
                raise ValueError(f"{a.file}: not a readable .npy array ({e})") from None
    if set(arrays) != {"inputs", "targets"}:
        raise ValueError(f"{m.path}: no inputs/targets arrays for split {split!r}")
    x, y = arrays["inputs"], arrays["targets"]
    if x.shape != y.shape or x.ndim != 2 or x.shape[1] != m.seq_len:
        raise ValueError(f"{m.path}: {split} arrays of shapes {x.shape}, {y.shape}")
    return x, y


def epoch_order(rows: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the training rows in `epoch`: a permutation drawn from (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(rows)


class ConversationLoader:
    """ShardLoader's interface (lmpipe.data.loader) over conversation rows: one a row.

    A step takes `batch_tokens / seq_len` rows of a permutation drawn anew each epoch from
    (seed, epoch); micro-batch `i` of rank `r` (of the data-parallel group `dp`) is slice
    `i * W + r` of them, as in ShardLoader, so
    the rows of a step do not depend on how ranks and micro-batches split it. The rows left over
    at the end of an epoch (fewer than a step) are dropped, different ones each epoch.
    """

    def __init__(
        self,
        inputs: np.ndarray,
        targets: np.ndarray,
        micro_batch: int,
        batch_tokens: int,
        dp: dist.ProcessGroup | DataShare,
        seed: int,
    ):
        self.inputs, self.targets = inputs, targets
        self.B, self.T = micro_batch, inputs.shape[1]
        self.rank, self.world_size = share_of(dp)
        self.seed = seed
        self.rows_per_step = batch_tokens // self.T
        self.micro_steps = self.rows_per_step // (micro_batch * self.world_size)
        assert self.micro_steps * micro_batch * self.world_size * self.T == batch_tokens
        self.steps_per_epoch = len(inputs) // self.rows_per_step
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"{len(inputs)} training conversations, fewer than one step of"
                f" {self.rows_per_step} (train.batch_tokens / seq_len)"
            )
        self.epoch, self.step, self.micro = 0, 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return epoch_order(len(self.inputs), self.seed, epoch)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's next micro-batch; after the step's last one, move to the next step."""
        start = self.step * self.rows_per_step + (self.micro * self.world_size + self.rank) * self.B
        rows = self._order[start : start + self.B]
        x = torch.from_numpy(self.inputs[rows].astype(np.int64))
        y = torch.from_numpy(self.targets[rows].astype(np.int64))
        self.micro += 1
        if self.micro == self.micro_steps:
            self.micro, self.step = 0, self.step + 1
            if self.step == self.steps_per_epoch:
                self.epoch, self.step = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
        return x, y

    def state_dict(self) -> dict[str, int]:
        """The position, identical on every rank; only valid at a step boundary."""
        assert self.micro == 0, "the loader position is saved between steps only"
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step, self.micro = state["epoch"], state["step"], 0
        self._order = self._permutation(self.epoch)


def conversation_val_batches(
    inputs: np.ndarray,
    targets: np.ndarray,
    micro_batch: int,
    val_tokens: int,
    dp: dist.ProcessGroup | DataShare,
) -> ValSet:
    """This rank's share (of the data-parallel group `dp`) of the first `val_tokens / seq_len`
    held-out rows, in batches; each row (a conversation) is a document of its own."""
    rank, world_size = share_of(dp)
    n = min(len(inputs), max(1, val_tokens // inputs.shape[1])) // world_size * world_size
    if n == 0:
        raise ValueError(f"{len(inputs)} held-out conversations, fewer than {world_size} ranks")
    mine = np.arange(rank, n, world_size)
    batches, docs = [], []
    for rows in np.array_split(mine, -(-len(mine) // micro_batch)):
        x = torch.from_numpy(inputs[rows].astype(np.int64))
        batches.append((x, torch.from_numpy(targets[rows].astype(np.int64))))
        docs.append(torch.from_numpy(rows.astype(np.int64))[:, None].expand_as(x))
    return ValSet(batches, docs, n)
