"""Reading conversation rows (what lmpipe.chat.data writes), and loaders over them with
ShardLoader's interface: the trainer reads them as it reads token shards.

`read_manifest` is the one reader of the conversations manifest (the fine-tuning worker, the
held-out loss, `load_split` below)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from lmpipe.data.loader import DataShare, ValSet, share_of
from lmpipe.files import read_json


@dataclass(frozen=True)
class ManifestArray:
    """An array file as the conversations manifest lists it; `file` is its path."""

    file: Path
    split: str  # "train" or "val"
    array: str  # "inputs" or "targets"
    sha256: str | None


@dataclass(frozen=True)
class ConversationsManifest:
    path: Path
    seq_len: int
    arrays: list[ManifestArray]
    kept: dict[str, int]  # conversations a split holds

    def rows(self, split: str) -> int:
        """Conversations `split` holds, as the preparation counted them."""
        if split not in self.kept:
            raise ValueError(f"{self.path}: no `kept` count of split {split!r}")
        return self.kept[split]

    def identity(self) -> list[str]:
        """The arrays' sha256 (a file's name where none is listed): the data's identity."""
        return [a.sha256 if a.sha256 is not None else a.file.name for a in self.arrays]


def read_manifest(path: str | Path) -> ConversationsManifest:
    """A conversations manifest.json (`kind: conversations`, `seq_len`, `shards` each with
    `file`, `split` and `array`); a missing file, bad JSON or a missing key names the file."""
    path = Path(path)
    m = read_json(path, "conversations manifest")
    if not isinstance(m, dict) or m.get("kind") != "conversations":
        kind = m.get("kind") if isinstance(m, dict) else None
        raise ValueError(f"{path}: not a conversations manifest (kind {kind!r})")
    try:
        arrays = [
            ManifestArray(path.parent / s["file"], s["split"], s["array"], s.get("sha256"))
            for s in m["shards"]
        ]
        return ConversationsManifest(path, int(m["seq_len"]), arrays, dict(m.get("kept", {})))
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{path}: not a conversations manifest (`seq_len`, `shards` each with `file`,"
            f" `split` and `array`; {type(e).__name__}: {e})"
        ) from None


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
