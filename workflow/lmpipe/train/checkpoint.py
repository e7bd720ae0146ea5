"""Checkpoints with torch.distributed.checkpoint (DCP): sharded, atomic, tied to their settings.

A periodic checkpoint `checkpoints/step_NNNNNN/` holds
- the model and optimizer state, sharded as each rank holds it (DCP files + `.metadata`);
- `train_state.json`: step, tokens, loader position, wall time and the settings hash;
- `rng_rank{r}.pt`: each rank's RNG states (tensors only, loaded with `weights_only=True`).
It is written as `step_NNNNNN.tmp/` and renamed when every rank has finished, so a directory
without `.tmp` is complete. The newest `keep` checkpoints of the current settings are kept.
Checkpoints of other settings are never resumed: they are moved aside to
`checkpoints/other-settings/{hash}/` (and the log says so), never deleted. A folder without
`.tmp` can still be broken when its files were copied, restored or cut short outside the
trainer (a crash mid-copy, a full disk): `damage` checks every file DCP's `.metadata` lists, at
the size it must have, and a broken checkpoint is moved to `checkpoints/broken/` with a warning
that names it and what is wrong; the one before is resumed. A save that does not fit on the disk
stops with `CheckpointDiskFull`, naming the folder and the bytes, before it writes (or, when the
disk fills during the write, as soon as it does): its `.tmp` is removed and the checkpoints
already there stay as they were. A fresh start (`--fresh-start`) moves every checkpoint aside to
`checkpoints/retired/{UTC time}/`.

The final checkpoint `final/` is the contract with `convert`: `{"model": state dict}` with full,
unprefixed parameter names (loadable in one process without a process group) and `meta.json`.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)

STATE_FILE = "train_state.json"
PREFIX = "step_"
TMP = ".tmp"
STEP_FOLDER = re.compile(rf"{PREFIX}(\d+)")
# DCP's files hold the tensors' bytes plus a little (headers, `.metadata`): what a save must find
# free, over the tensor bytes of every rank
ROOM_MARGIN, ROOM_EXTRA = 1.02, 1 << 16


class CheckpointDiskFull(OSError):
    """A checkpoint that does not fit in its folder's free space (errno ENOSPC)."""

    def __init__(self, folder: Path, needed: int, free: int):
        super().__init__(
            errno.ENOSPC,
            f"no room for checkpoint {folder.name.removesuffix(TMP)} in {folder.parent}: it"
            f" needs {needed:,} bytes and {free:,} were free. The checkpoints already there are"
            " intact; free space there (or lower train.keep_checkpoints) and rerun",
        )


def tensor_bytes(state: Any) -> int:
    """This rank's bytes of the tensors in a nested state dict (a DTensor: its local shard)."""
    if isinstance(state, DTensor):
        state = state.to_local()
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(tensor_bytes(v) for v in state)
    return 0


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def write_state(
    state: dict[str, Any], tmp: Path, group: dist.ProcessGroup | None = None
) -> Future | None:
    """`dcp.save(state)` into `tmp`, or `CheckpointDiskFull` when it does not fit. With `group`
    (a process group of its own), `dcp.async_save` instead: it returns once the state is copied
    to CPU memory and writes in a thread; `Future.result()` raises what the write met.

    Every rank's tensor bytes are summed and checked against the free space first (rank 0's view
    of the folder, which all ranks share), so a save that cannot fit writes nothing; a disk that
    fills during the write all the same (another writer) gives the same error."""
    sizes: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(sizes, tensor_bytes(state))
    needed = int(sum(sizes) * ROOM_MARGIN) + ROOM_EXTRA
    free = _broadcast(free_bytes(tmp))
    if free < needed:
        raise CheckpointDiskFull(tmp, needed, free)

    def disk_full_or(e: CheckpointException) -> BaseException:
        enospc = any(getattr(exc, "errno", None) == errno.ENOSPC for exc, _ in e.failures.values())
        # torch.save's zip writer reports a full disk as a RuntimeError ("unexpected pos"), so
        # a failure that leaves less room than the rest of the state needs is a full disk too
        written = sum(f.stat().st_size for f in tmp.iterdir() if f.is_file())
        if enospc or free_bytes(tmp) < needed - written:
            return CheckpointDiskFull(tmp, needed, free)
        return e

    if group is not None:
        done: Future = Future()

        def finish(write: Future) -> None:
            try:
                done.set_result(write.result())
            except CheckpointException as e:
                done.set_exception(disk_full_or(e))
            except BaseException as e:
                done.set_exception(e)

        dcp.async_save(state, checkpoint_id=tmp, process_group=group).add_done_callback(finish)
        return done
    try:
        dcp.save(state, checkpoint_id=tmp)
    except CheckpointException as e:
        raise disk_full_or(e) from e
    return None


def damage(path: Path) -> str | None:
    """What makes the checkpoint folder `path` unusable, or None when every file it needs is
    there at its full size: train_state.json (a JSON object), DCP's `.metadata`, every file that
    `.metadata` lists (at least offset + length bytes), and each rank's RNG file."""
    return _inspect(path)[1]


def _inspect(path: Path) -> tuple[dict[str, Any], str | None]:
    """(train_state.json's content, what is broken): `damage`, and the state it read on the way
    (empty where the folder is broken)."""
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError) as e:
        return {}, f"{STATE_FILE} is unreadable ({type(e).__name__}: {e})"
    if not isinstance(state, dict):
        return {}, f"{STATE_FILE} holds {type(state).__name__}, not an object"
    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except Exception as e:  # missing, cut short or garbled: unpickling raises many kinds
        return {}, f".metadata is unreadable ({type(e).__name__}: {e})"
    needed: dict[str, int] = {}  # file -> the bytes it must hold
    for info in metadata.storage_data.values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    needed |= {f"rng_rank{r:05d}.pt": 1 for r in range(state.get("world_size", 0))}
    for name, size in sorted(needed.items()):
        file = path / name
        if not file.is_file():
            return {}, f"{name} is missing"
        if file.stat().st_size < size:
            return {}, f"{name} holds {file.stat().st_size} bytes of the {size} it must"
    return state, None


def _broadcast(obj: Any) -> Any:
    """Rank 0's value on every rank (decisions about files must be the same everywhere)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _plain(value: Any) -> Any:
    """A tensor subclass that wraps a plain tensor (torchao float8's FSDP weight,
    lmpipe.train.fp8) as that plain tensor, sharing its storage (a load fills the parameter), so
    that checkpoints hold plain tensors and read without torchao (convert, export)."""
    local = value._local_tensor if isinstance(value, DTensor) else value
    if not isinstance(local, torch.Tensor) or type(local) is torch.Tensor:
        return value
    inner = getattr(local, "_tensor", None)
    if not isinstance(inner, torch.Tensor):
        return value
    if isinstance(value, DTensor):
        return DTensor.from_local(
            inner, value.device_mesh, value.placements, run_check=False,
            shape=value.shape, stride=value.stride(),
        )  # fmt: skip
    return inner


def plain_state(state: Any) -> Any:
    """`state` (nested dicts of tensors) with each wrapped tensor plain (_plain)."""
    if isinstance(state, dict):
        return {k: plain_state(v) for k, v in state.items()}
    return _plain(state)


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Checkpointer:
    """Owns the checkpoint folder: when to save, saving, pruning, and what to resume from."""

    def __init__(
        self,
        folder: str | Path,
        settings_hash: str,
        every: int,
        keep: int,
        asynchronous: bool = False,
    ):
        self.folder = Path(folder)
        self.settings_hash = settings_hash
        self.every = every
        self.keep = keep
        # train.checkpoint_async: periodic saves write in a thread (dcp.async_save), whose
        # collectives run on a gloo group of their own so that they never interleave with the
        # training's (as torchtitan does); at most one is in flight (`wait`)
        self.group = dist.new_group(backend="gloo") if asynchronous else None
        self.pending: tuple[Future, Path, Path] | None = None  # (write, tmp, final)

    def should_save(self, step: int, last_step: int) -> bool:
        return step == last_step or (self.every > 0 and step % self.every == 0)

    # ---- finding ----------------------------------------------------------------------------

    def _complete(self) -> list[tuple[int, Path, str | None]]:
        """(step, path, settings hash) of every complete checkpoint, oldest first; the hash is
        None where the folder is broken (see `damage`)."""
        found = []
        for path in self.folder.glob(f"{PREFIX}*"):
            number = STEP_FOLDER.fullmatch(path.name)
            if number is None or not path.is_dir():  # `.tmp` folders and stray names
                continue
            state, _ = _inspect(path)  # broken: no state, so no settings hash
            found.append((int(number[1]), path, state.get("settings_hash")))
        return sorted(found)

    def newest(self) -> Path | None:
        """The newest complete checkpoint of these settings (read-only; for messages)."""
        mine = [path for _, path, digest in self._complete() if digest == self.settings_hash]
        return mine[-1] if mine else None

    def retire_all(self) -> None:
        """Move every checkpoint aside (a fresh start), on rank 0; nothing is deleted."""
        if dist.get_rank() == 0:
            old = [p for p in self.folder.glob(f"{PREFIX}*") if p.is_dir()]
            if old:
                stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
                aside = self.folder / "retired" / stamp
                aside.mkdir(parents=True)
                for path in old:
                    path.rename(aside / path.name)
                log.warning("fresh start: moved %d checkpoint(s) to %s", len(old), aside)
        dist.barrier()

    def find_resume(self) -> Path | None:
        """Newest complete checkpoint of these settings, or None (then start fresh).

        Rank 0 looks, tidies and decides; every rank gets the same answer. Unfinished `.tmp`
        folders (a crash during a save) are removed; other settings' checkpoints are moved aside.
        """
        choice, seen = None, False  # seen: a checkpoint was there, usable or not
        if dist.get_rank() == 0:
            for tmp in self.folder.glob(f"{PREFIX}*{TMP}"):
                log.warning("removing unfinished checkpoint %s", tmp)
                shutil.rmtree(tmp)
                seen = True
            for _, path, digest in self._complete():
                seen = True
                if digest == self.settings_hash:
                    choice = str(path)
                    continue
                if digest is None:
                    self._move_broken(path)
                    continue
                aside = self.folder / "other-settings" / str(digest) / path.name
                log.warning(
                    "checkpoint %s belongs to other settings (hash %s, now %s): not resuming it;"
                    " moved to %s",
                    path,
                    digest,
                    self.settings_hash,
                    aside,
                )
                aside.parent.mkdir(parents=True, exist_ok=True)
                path.rename(aside)
            if choice is None and seen:
                log.warning(
                    "no usable checkpoint of settings %s in %s: starting fresh",
                    self.settings_hash,
                    self.folder,
                )
            elif choice is None:  # a first run: nothing to warn of
                log.info("no checkpoint in %s yet: starting at step 0", self.folder)
        choice = _broadcast(choice)
        return Path(choice) if choice else None

    def _move_broken(self, path: Path) -> None:
        """Move a broken checkpoint to `broken/` (never deleted: it may be repairable)."""
        aside = self.folder / "broken" / path.name
        if aside.exists():  # broken twice at the same step
            aside = aside.with_name(f"{path.name}-{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}")
        log.warning(
            "checkpoint %s is broken: %s; not resuming it; moved to %s", path, damage(path), aside
        )
        aside.parent.mkdir(parents=True, exist_ok=True)
        path.rename(aside)

    # ---- saving and loading -----------------------------------------------------------------

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        train_state: dict[str, Any],
        blocking: bool = True,
    ) -> Path:
        """Write `step_NNNNNN/` on all ranks (atomically), then prune old ones. `blocking=False`
        on an asynchronous Checkpointer returns once the state is staged; the folder appears
        (renamed from `.tmp`) at the next `save` or `wait`."""
        self.wait()
        final = self.folder / f"{PREFIX}{step:06d}"
        tmp = begin_folder(final)
        try:
            torch.save(_rng_state(), tmp / f"rng_rank{dist.get_rank():05d}.pt")
            if dist.get_rank() == 0:
                state = dict(
                    train_state,
                    step=step,
                    settings_hash=self.settings_hash,
                    world_size=dist.get_world_size(),
                )
                (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = plain_state({"model": model_sd, "optim": optim_sd})
            if self.group is not None and not blocking:
                self.pending = (write_state(state, tmp, self.group), tmp, final)
                return final
            write_state(state, tmp)
        except BaseException:
            drop_folder(tmp)
            raise
        self._commit(tmp, final)
        return final

    def wait(self) -> Path | None:
        """Finish the save in flight, if any: wait for its write, then rename and prune."""
        if self.pending is None:
            return None
        write, tmp, final = self.pending
        self.pending = None
        try:
            write.result()
        except BaseException:
            drop_folder(tmp)
            raise
        self._commit(tmp, final)
        return final

    def _commit(self, tmp: Path, final: Path) -> None:
        commit_folder(tmp, final)
        if dist.get_rank() == 0:
            self._prune()

    def _prune(self) -> None:
        mine = [path for _, path, digest in self._complete() if digest == self.settings_hash]
        for path in mine[: -self.keep]:
            shutil.rmtree(path)

    def load(
        self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """Restore model, optimizer and this rank's RNG; return the train state (step, loader)."""
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = plain_state({"model": model_sd, "optim": optim_sd})
        try:
            dcp.load(state, checkpoint_id=path)
        except CheckpointException as e:  # damage() found every file whole, yet it fails
            raise RuntimeError(
                f"checkpoint {path} could not be loaded (the DCP error is above); move it aside"
                " to resume from the one before, or start anew with --fresh-start"
            ) from e
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        rng_file = path / f"rng_rank{dist.get_rank():05d}.pt"
        _set_rng_state(torch.load(rng_file, weights_only=True))
        return json.loads((path / STATE_FILE).read_text())


def begin_folder(final: Path) -> Path:
    """`final.tmp/`, empty, made by rank 0 and seen by every rank: where a save writes."""
    tmp = final.with_name(final.name + TMP)
    if dist.get_rank() == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    dist.barrier()
    return tmp


def commit_folder(tmp: Path, final: Path) -> None:
    """Once every rank has written into `tmp`, rank 0 renames it to `final`."""
    dist.barrier()  # every rank's files are written
    if dist.get_rank() == 0:
        if final.exists():  # the same step from an earlier attempt
            shutil.rmtree(final)
        tmp.rename(final)
    dist.barrier()


def drop_folder(tmp: Path) -> None:
    """A failed save (a full disk): its part goes now, and with it the space it took."""
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_folder(final: Path) -> Iterator[Path]:
    """All ranks write into `final.tmp/`; once every rank is done, rank 0 renames it to `final`.

    So a checkpoint folder exists only when complete, whatever kills the job while it is written.
    """
    tmp = begin_folder(final)
    try:
        yield tmp
    except BaseException:
        drop_folder(tmp)
        raise
    commit_folder(tmp, final)


def save_final(folder: str | Path, model: torch.nn.Module, meta: dict[str, Any]) -> None:
    """The contract with convert: DCP `{"model": state dict}` + `meta.json`, renamed at the end."""
    with atomic_folder(Path(folder)) as tmp:
        write_state(plain_state({"model": get_model_state_dict(model)}), tmp)
        if dist.get_rank() == 0:
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
