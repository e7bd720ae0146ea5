"""Checkpoint housekeeping, in one process (a 1-rank gloo group): what is saved, kept, resumed.

The promises are those of lmpipe.train.checkpoint's docstring: `step_NNNNNN/` written as
`.tmp` and renamed; the newest `keep` of the current settings kept; other settings' checkpoints
(a changed shard set or world size: another trajectory hash) moved aside, never resumed, never
deleted; unfinished `.tmp` folders removed when a run starts.
"""

from __future__ import annotations

import errno
import json
import logging
import pickle
import subprocess
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from lmpipe.config import TrainJob
from lmpipe.data.loader import ValSet
from lmpipe.train import checkpoint
from lmpipe.train.checkpoint import Checkpointer, atomic_folder, save_final
from lmpipe.train.loop import Task, trajectory_hash

pytestmark = pytest.mark.usefixtures("one_rank_group")  # FSDP2/DCP: tests/conftest.py

MINE, OTHER = "a" * 16, "b" * 16


def model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def save(ckpt: Checkpointer, step: int, **state):
    model, optimizer = model_and_optimizer(step)
    return ckpt.save(step, model, optimizer, {"tokens": 100 * step} | state)


def names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize(
    ("every", "last", "saved"),
    [(4, 10, [4, 8, 10]), (1, 3, [1, 2, 3]), (0, 5, [5])],
)
def test_saves_every_n_steps_and_at_the_last(tmp_path, every, last, saved):
    """checkpoint_every steps and the last step are saved; checkpoint_every 0: the last only."""
    ckpt = Checkpointer(tmp_path, MINE, every=every, keep=2)
    assert [s for s in range(1, last + 1) if ckpt.should_save(s, last)] == saved


def test_load_restores_weights_optimizer_rng_and_train_state(tmp_path):
    """A resumed run continues exactly: same weights, optimizer moments, RNG and position."""
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=2)
    model, optimizer = model_and_optimizer(1)
    saved_weights = {k: v.clone() for k, v in model.state_dict().items()}
    saved_moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    path = ckpt.save(4, model, optimizer, {"tokens": 400, "loader": {"shard": 1, "pos": 64}})
    after_save = torch.rand(5)

    fresh, fresh_optimizer = model_and_optimizer(2)
    torch.rand(7)  # the RNG moves on
    state = ckpt.load(path, fresh, fresh_optimizer)
    assert torch.equal(torch.rand(5), after_save)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, saved_weights[k])
    assert torch.equal(fresh_optimizer.state_dict()["state"][0]["exp_avg"], saved_moments)
    assert state == {
        "tokens": 400,
        "loader": {"shard": 1, "pos": 64},
        "step": 4,
        "settings_hash": MINE,
        "world_size": 1,  # damage() checks an RNG file a rank
    }


def test_cuda_rng_is_saved_and_restored_when_there_is_a_gpu(monkeypatch):
    """A rank's RNG states include the CUDA generator's where there is one, and are put back."""
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: torch.tensor([1, 2, 3]))
    monkeypatch.setattr(torch.cuda, "set_rng_state", restored.append)
    state = checkpoint._rng_state()
    assert sorted(state) == ["cpu", "cuda"]
    checkpoint._set_rng_state(state)
    assert [t.tolist() for t in restored] == [[1, 2, 3]]
    checkpoint._set_rng_state({"cpu": state["cpu"]})  # saved without a GPU: CUDA left alone
    assert len(restored) == 1


def test_only_the_newest_keep_checkpoints_of_these_settings_are_kept(tmp_path):
    """keep_checkpoints 2: after each save the two newest remain; older ones are removed."""
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=2)
    for step in (4, 8, 12):
        save(ckpt, step)
    assert names(tmp_path) == ["step_000008", "step_000012"]
    save(ckpt, 16)
    assert names(tmp_path) == ["step_000012", "step_000016"]


def test_pruning_orders_by_step_past_six_digits_and_spares_other_settings(tmp_path):
    """Step 1000000 is newer than 999999 (not by name), and other settings' are never pruned."""
    save(Checkpointer(tmp_path, OTHER, every=1, keep=1), 5)
    ckpt = Checkpointer(tmp_path, MINE, every=1, keep=1)
    save(ckpt, 999_999)
    save(ckpt, 1_000_000)
    assert names(tmp_path) == ["step_000005", "step_1000000"]
    assert ckpt.newest() == tmp_path / "step_1000000"


def test_resumes_the_newest_of_these_settings(tmp_path):
    """find_resume picks the newest checkpoint of the current settings hash."""
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=5)
    for step in (4, 12, 8):
        save(ckpt, step)
    assert ckpt.newest() == tmp_path / "step_000012"
    assert ckpt.find_resume() == tmp_path / "step_000012"
    assert names(tmp_path) == ["step_000004", "step_000008", "step_000012"]


def test_no_checkpoint_starts_fresh(tmp_path):
    """An empty (or missing) checkpoint folder: nothing to resume."""
    ckpt = Checkpointer(tmp_path / "checkpoints", MINE, every=4, keep=2)
    assert ckpt.newest() is None
    assert ckpt.find_resume() is None


def test_unfinished_tmp_folders_are_removed_at_start_and_never_resumed(tmp_path):
    """A crashed save's step_N.tmp/ is deleted at start, never resumed; a stray file is ignored."""
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=2)
    save(ckpt, 4)
    (tmp_path / "step_000008.tmp").mkdir()
    (tmp_path / "step_000008.tmp" / "train_state.json").write_text(
        json.dumps({"step": 8, "settings_hash": MINE})
    )
    (tmp_path / "step_000012.tmp").mkdir()
    (tmp_path / "step_000009").write_text("not a folder")
    assert ckpt.newest() == tmp_path / "step_000004"  # read-only: tidies nothing
    assert (tmp_path / "step_000008.tmp").exists()
    assert ckpt.find_resume() == tmp_path / "step_000004"
    assert names(tmp_path) == ["step_000004", "step_000009"]


def test_a_leftover_tmp_or_an_earlier_save_of_the_same_step_is_replaced(tmp_path):
    """Saving step N over a crashed `step_N.tmp/` or an existing `step_N/` gives the new one."""
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=2)
    (tmp_path / "step_000004.tmp").mkdir()
    (tmp_path / "step_000004.tmp" / "junk").write_text("from a crash")
    save(ckpt, 4, tokens=1)
    save(ckpt, 4, tokens=2)
    assert names(tmp_path) == ["step_000004"]
    assert not (tmp_path / "step_000004" / "junk").exists()
    assert json.loads((tmp_path / "step_000004" / "train_state.json").read_text())["tokens"] == 2


def data_file(path) -> str:
    """The name of a checkpoint's (one rank's) DCP data file."""
    (name,) = [p.name for p in path.iterdir() if p.suffix == ".distcp"]
    return name


DAMAGES = {
    # name: (what a crash, a cut-short copy or a full disk leaves, what the warning must say)
    "garbage state": (
        lambda p: (p / "train_state.json").write_bytes(b"\0\0{not json"),
        "train_state.json is unreadable",
    ),
    "missing state": (
        lambda p: (p / "train_state.json").unlink(),
        "train_state.json is unreadable",
    ),
    "state not an object": (
        lambda p: (p / "train_state.json").write_text("[1, 2]"),
        "train_state.json holds list, not an object",
    ),
    "missing metadata": (lambda p: (p / ".metadata").unlink(), ".metadata is unreadable"),
    "cut metadata": (
        lambda p: (p / ".metadata").write_bytes((p / ".metadata").read_bytes()[:50]),
        ".metadata is unreadable",
    ),
    "missing data": (lambda p: (p / data_file(p)).unlink(), ".distcp is missing"),
    "cut data": (
        lambda p: (p / data_file(p)).write_bytes((p / data_file(p)).read_bytes()[:-1]),
        ".distcp holds ",
    ),
    "missing rng": (lambda p: (p / "rng_rank00000.pt").unlink(), "rng_rank00000.pt is missing"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_broken_checkpoint_is_named_moved_to_broken_and_the_one_before_resumed(
    tmp_path, damage, caplog
):
    """The newest checkpoint broken after its rename (#16): never loaded, never deleted."""
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=5)
    save(ckpt, 4)
    bad = save(ckpt, 8)
    break_it, why = DAMAGES[damage]
    break_it(bad)
    kept = sorted(p.name for p in bad.iterdir())
    assert ckpt.newest() == tmp_path / "step_000004"
    with caplog.at_level(logging.WARNING, logger="lmpipe.train.checkpoint"):
        assert ckpt.find_resume() == tmp_path / "step_000004"
    assert f"checkpoint {bad} is broken: " in caplog.text and why in caplog.text
    assert names(tmp_path) == ["broken", "step_000004"]
    assert sorted(p.name for p in (tmp_path / "broken" / "step_000008").iterdir()) == kept
    # what is resumed loads
    model, optimizer = model_and_optimizer(99)
    assert ckpt.load(tmp_path / "step_000004", model, optimizer)["tokens"] == 400


def test_with_every_checkpoint_broken_the_run_starts_fresh_and_says_so(tmp_path, caplog):
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=5)
    for step in (4, 8):
        (save(ckpt, step) / ".metadata").unlink()
    save(ckpt, 4)  # the same step saved again over a broken one
    (tmp_path / "step_000004" / ".metadata").unlink()
    with caplog.at_level(logging.WARNING, logger="lmpipe.train.checkpoint"):
        assert ckpt.find_resume() is None
    assert "no usable checkpoint of settings" in caplog.text and "starting fresh" in caplog.text
    assert names(tmp_path) == ["broken"]
    assert len(names(tmp_path / "broken")) == 2


def test_a_checkpoint_whose_bytes_do_not_load_names_itself(tmp_path):
    """Every file whole but the data garbled: the load stops with the checkpoint's name."""
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=5)
    path = save(ckpt, 4)
    data = path / data_file(path)
    data.write_bytes(b"\xff" * data.stat().st_size)
    assert checkpoint.damage(path) is None
    model, optimizer = model_and_optimizer(99)
    with pytest.raises(RuntimeError, match=f"checkpoint {path} could not be loaded"):
        ckpt.load(path, model, optimizer)


def test_stray_folders_named_like_checkpoints_are_ignored(tmp_path):
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=5)
    save(ckpt, 4)
    (tmp_path / "step_backup").mkdir()
    (tmp_path / "step_000009").write_text("a file, not a folder")
    assert ckpt.find_resume() == tmp_path / "step_000004"
    assert names(tmp_path) == ["step_000004", "step_000009", "step_backup"]


def test_other_settings_are_moved_aside_by_hash_never_resumed(tmp_path):
    """Checkpoints of another settings hash go to other-settings/{hash}/, intact."""
    other = Checkpointer(tmp_path, OTHER, every=4, keep=5)
    save(other, 4)
    save(other, 8)
    mine = Checkpointer(tmp_path, MINE, every=4, keep=5)
    save(mine, 12)
    assert mine.find_resume() == tmp_path / "step_000012"
    aside = tmp_path / "other-settings" / OTHER
    assert names(aside) == ["step_000004", "step_000008"]
    state = json.loads((aside / "step_000008" / "train_state.json").read_text())
    assert state["settings_hash"] == OTHER


def test_a_fresh_start_moves_every_checkpoint_to_retired_utc_time(tmp_path, monkeypatch, caplog):
    """--fresh-start moves all checkpoints to retired/{UTC time}/, in any time zone; logged."""
    monkeypatch.setenv("TZ", "UTC-9")  # the local clock 9 hours ahead of UTC
    time.tzset()
    monkeypatch.undo()
    save(Checkpointer(tmp_path, OTHER, every=4, keep=5), 4)
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=5)
    save(ckpt, 8)
    try:
        with caplog.at_level(logging.INFO, logger="lmpipe.train.checkpoint"):
            ckpt.retire_all()
    finally:
        time.tzset()
    (stamp,) = (tmp_path / "retired").iterdir()
    when = datetime.strptime(stamp.name, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - when).total_seconds()) < 60
    assert names(stamp) == ["step_000004", "step_000008"]
    assert f"moved 2 checkpoint(s) to {stamp}" in caplog.text
    assert ckpt.find_resume() is None


def test_the_log_says_what_was_removed_moved_or_not_found(tmp_path, caplog):
    """The log names a removed .tmp, a checkpoint moved aside (both hashes), and a fresh start."""
    save(Checkpointer(tmp_path, OTHER, every=4, keep=5), 4)
    (tmp_path / "step_000008.tmp").mkdir()
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=5)
    with caplog.at_level(logging.INFO, logger="lmpipe.train.checkpoint"):
        assert ckpt.find_resume() is None
    aside = tmp_path / "other-settings" / OTHER / "step_000004"
    assert f"removing unfinished checkpoint {tmp_path / 'step_000008.tmp'}" in caplog.text
    assert (
        f"checkpoint {tmp_path / 'step_000004'} belongs to other settings (hash {OTHER}, now"
        f" {MINE}): not resuming it; moved to {aside}" in caplog.text
    )
    assert f"no usable checkpoint of settings {MINE} in {tmp_path}: starting fresh" in caplog.text


def test_a_first_run_starts_at_step_0_without_a_warning(tmp_path, caplog):
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=5)
    with caplog.at_level(logging.INFO, logger="lmpipe.train.checkpoint"):
        assert ckpt.find_resume() is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert f"no checkpoint in {tmp_path} yet: starting at step 0" in caplog.text


def test_rng_files_load_tensors_only(tmp_path):
    """RNG files are loaded with weights_only: a file holding arbitrary objects is refused."""
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=2)
    path = save(ckpt, 4)
    torch.save({"cpu": torch.get_rng_state(), "x": Pickled()}, path / "rng_rank00000.pt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        ckpt.load(path, *model_and_optimizer())


class Pickled:
    """Any class: unpickling it would run code of the file's choosing."""


def test_a_fresh_start_without_checkpoints_does_nothing(tmp_path):
    """Nothing to retire: no retired/ folder appears."""
    Checkpointer(tmp_path, MINE, every=4, keep=5).retire_all()
    assert names(tmp_path) == []


# ---- what makes a checkpoint "of these settings" (lmpipe.train.loop.trajectory_hash) ----------


def job(**train) -> TrainJob:
    t = {"seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "max_steps": 8}
    t |= {"optimizer": {"name": "adamw", "lr": 1e-3}, "keep_checkpoints": 2} | train
    model = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64}
    launch = {"device": "cpu", "nodes": 1, "procs_per_node": 1, "peak_flops": None}
    return TrainJob.from_json(
        json.dumps({"run": "r", "dataset": "d", "model": model, "train": t, "launch": launch})
    )


def digest(j: TrainJob, shards: list[str], world_size: int) -> str:
    task = Task(train=j.train, loader=None, val=ValSet([], [], 0), data_identity=shards)
    return trajectory_hash(j, task, world_size)


@pytest.mark.parametrize(
    "change",
    ["shard set", "shard content", "world size", "batch_tokens"],
)
def test_a_changed_shard_set_or_world_size_starts_fresh(tmp_path, change):
    """Other shards (set or content) or world size: the old checkpoint is moved aside."""
    before = digest(job(), ["sha-1", "sha-2"], 2)
    after = {
        "shard set": lambda: digest(job(), ["sha-1", "sha-2", "sha-3"], 2),
        "shard content": lambda: digest(job(), ["sha-1", "sha-X"], 2),
        "world size": lambda: digest(job(), ["sha-1", "sha-2"], 4),
        "batch_tokens": lambda: digest(job(batch_tokens=512), ["sha-1", "sha-2"], 2),
    }[change]()
    save(Checkpointer(tmp_path, before, every=4, keep=2), 4)
    assert Checkpointer(tmp_path, after, every=4, keep=2).find_resume() is None
    assert (tmp_path / "other-settings" / before / "step_000004").is_dir()


def test_checkpointing_settings_do_not_change_the_trajectory(tmp_path):
    """keep_checkpoints, checkpoint_every, val_every: the same run, so its checkpoint resumes."""
    before = digest(job(), ["sha-1"], 1)
    after = digest(job(keep_checkpoints=5, checkpoint_every=10, val_every=3), ["sha-1"], 1)
    assert after == before
    save(Checkpointer(tmp_path, before, every=4, keep=2), 4)
    assert Checkpointer(tmp_path, after, every=10, keep=5).find_resume() == tmp_path / "step_000004"


# ---- the final checkpoint: the contract with convert ------------------------------------------


def test_final_holds_the_full_model_and_meta_and_no_tmp(tmp_path):
    """final/: DCP {"model": state dict} with unprefixed names, meta.json; no final.tmp left."""
    model, _ = model_and_optimizer(3)
    save_final(tmp_path / "final", model, {"step": 8, "model": {"n_layer": 2}})
    assert names(tmp_path) == ["final"]
    assert json.loads((tmp_path / "final" / "meta.json").read_text()) == {
        "step": 8,
        "model": {"n_layer": 2},
    }
    state = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    dcp.load({"model": state}, checkpoint_id=tmp_path / "final")
    assert sorted(state) == ["bias", "weight"]
    for k, v in model.state_dict().items():
        assert torch.equal(state[k], v)


def test_atomic_folder_exists_only_once_complete(tmp_path):
    """While the block runs only `name.tmp/` exists; afterwards only `name/`."""
    final = tmp_path / "step_000001"
    with atomic_folder(final) as tmp:
        assert tmp == tmp_path / "step_000001.tmp"
        assert tmp.is_dir() and not final.exists()
        (tmp / "x").write_text("1")
    assert names(tmp_path) == ["step_000001"]
    assert (final / "x").read_text() == "1"


# ---- a full disk -------------------------------------------------------------------------------

DISK_BYTES = 2 << 20  # 2 MiB: room for one checkpoint of `big_model_and_optimizer`, not two


def big_model_and_optimizer():
    """1.38 MB of checkpoint (weights and AdamW's two moments, fp32)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 448)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 256)).sum().backward()
    optimizer.step()
    return model, optimizer


def used_bytes(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A 2 MiB filesystem: a real tmpfs where this process may mount one (root, as in CI);
    elsewhere the same limit simulated in DCP's file streams and in the free-space query."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(folder)]
    if subprocess.run(mount, capture_output=True).returncode == 0:
        yield folder
        subprocess.run(["umount", str(folder)], check=True)
        return
    from torch.distributed.checkpoint.filesystem import FileSystem

    class CappedFile:
        """A file whose writes fail with ENOSPC once the folder would pass DISK_BYTES."""

        def __init__(self, file):
            self.file = file

        def write(self, data) -> int:
            if used_bytes(folder) + len(data) > DISK_BYTES:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.file.write(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

    real_create_stream = FileSystem.create_stream

    @contextmanager
    def create_stream(self, path, mode):
        with real_create_stream(self, path, mode) as file:
            yield CappedFile(file) if mode == "wb" and folder in Path(path).parents else file

    monkeypatch.setattr(FileSystem, "create_stream", create_stream)
    monkeypatch.setattr(checkpoint, "free_bytes", lambda _: DISK_BYTES - used_bytes(folder))
    yield folder


def test_a_save_that_cannot_fit_stops_before_writing_and_names_folder_and_bytes(
    small_disk, monkeypatch
):
    ckpt = Checkpointer(small_disk, MINE, every=4, keep=5)
    model, optimizer = big_model_and_optimizer()
    first = ckpt.save(4, model, optimizer, {"tokens": 400})
    monkeypatch.setattr(checkpoint.dcp, "save", lambda *a, **k: pytest.fail("it began to write"))
    with pytest.raises(checkpoint.CheckpointDiskFull) as failure:
        ckpt.save(8, model, optimizer, {"tokens": 800})
    message = str(failure.value)
    assert f"no room for checkpoint step_000008 in {small_disk}: it needs " in message
    needed = int(message.split("it needs ")[1].split(" bytes")[0].replace(",", ""))
    assert 1_380_000 < needed < 1_500_000  # the state's 1.38 MB and the margin
    assert failure.value.errno == errno.ENOSPC
    assert names(small_disk) == ["step_000004"]  # no .tmp left
    assert checkpoint.damage(first) is None
    assert ckpt.find_resume() == first


def test_a_disk_that_fills_during_the_write_leaves_the_previous_checkpoint_whole(
    small_disk, monkeypatch
):
    """The free-space check passed (another writer filled the disk after it): the write itself
    runs out of room, the same error comes, the partial folder is removed."""
    ckpt = Checkpointer(small_disk, MINE, every=4, keep=5)
    model, optimizer = big_model_and_optimizer()
    first = ckpt.save(4, model, optimizer, {"tokens": 400})
    answers = iter([1 << 40])  # the check before the write sees room; later queries the truth
    real_free_bytes = checkpoint.free_bytes
    monkeypatch.setattr(checkpoint, "free_bytes", lambda f: next(answers, 0) or real_free_bytes(f))
    with pytest.raises(checkpoint.CheckpointDiskFull, match=f"in {small_disk}: it needs "):
        ckpt.save(8, model, optimizer, {"tokens": 800})
    assert names(small_disk) == ["step_000004"]
    assert checkpoint.damage(first) is None
    fresh, fresh_optimizer = big_model_and_optimizer()
    assert ckpt.load(first, fresh, fresh_optimizer)["tokens"] == 400


# ---- asynchronous saves (train.checkpoint_async) ----------------------------------------------


def test_an_async_save_holds_the_state_of_its_call_and_appears_only_when_done(tmp_path):
    """The write runs in a thread after save() returns; the training goes on changing the
    weights meanwhile; the checkpoint holds the weights of the call, and `step_N/` exists only
    once the write is done (the rename waits for it)."""
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=2, asynchronous=True)
    model, optimizer = big_model_and_optimizer()
    at_save = {k: v.clone() for k, v in model.state_dict().items()}
    moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    path = ckpt.save(4, model, optimizer, {"tokens": 400}, blocking=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the next steps
    assert not path.exists() and ckpt.pending is not None  # renamed once the write is done
    assert ckpt.wait() == path
    assert ckpt.pending is None and names(tmp_path) == ["step_000004"]
    fresh, fresh_optimizer = big_model_and_optimizer()
    assert ckpt.load(path, fresh, fresh_optimizer)["tokens"] == 400
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, at_save[k]), k
    assert torch.equal(fresh_optimizer.state_dict()["state"][0]["exp_avg"], moments)


def test_the_next_save_finishes_the_one_in_flight_first_and_prunes(tmp_path):
    ckpt = Checkpointer(tmp_path, MINE, every=4, keep=2, asynchronous=True)
    model, optimizer = model_and_optimizer()
    for step in (4, 8, 12):
        ckpt.save(step, model, optimizer, {"tokens": step}, blocking=False)
    assert names(tmp_path) == ["step_000004", "step_000008", "step_000012.tmp"]
    ckpt.save(16, model, optimizer, {"tokens": 16})  # blocking: the save on a signal
    assert ckpt.pending is None
    assert names(tmp_path) == ["step_000012", "step_000016"]
    assert ckpt.find_resume() == tmp_path / "step_000016"


def test_an_async_write_that_fills_the_disk_fails_at_wait_and_leaves_no_tmp(
    small_disk, monkeypatch
):
    ckpt = Checkpointer(small_disk, MINE, every=4, keep=5, asynchronous=True)
    model, optimizer = big_model_and_optimizer()
    first = ckpt.save(4, model, optimizer, {"tokens": 400})
    answers = iter([1 << 40])  # the check before the write sees room
    real_free_bytes = checkpoint.free_bytes
    monkeypatch.setattr(checkpoint, "free_bytes", lambda f: next(answers, 0) or real_free_bytes(f))
    ckpt.save(8, model, optimizer, {"tokens": 800}, blocking=False)
    with pytest.raises(checkpoint.CheckpointDiskFull, match=f"in {small_disk}: it needs "):
        ckpt.wait()
    assert names(small_disk) == ["step_000004"]
    assert checkpoint.damage(first) is None
