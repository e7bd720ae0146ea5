"""The read-ahead loader (lmpipe.data.prefetch): the same batches as the bare loader, in order,
the consumer's position (not the thread's) in `state_dict()`, errors raised where the bare loader
raises them, a thread that stops. Real FineWeb tokens in real shards; CPU only."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO, TOKENIZER_DIR
from lmpipe.chat.loader import ConversationLoader
from lmpipe.data.loader import DataShare, ShardLoader
from lmpipe.data.prefetch import Prefetcher
from lmpipe.data.shards import ShardError, write_shard
from lmpipe.data.tokenizer import gpt2_encoding

# micro-batches of 4 x 32, 2 ranks, 2 micro-steps a step: a step reads 256 (+1) tokens
SHAPE = {"micro_batch": 4, "seq_len": 32, "batch_tokens": 512}
SHARE = DataShare(1, 2)  # rank 1 of 2
SHARD0_STEPS = (6000 - 1) // 512  # 11 steps in the first shard, then the second


@pytest.fixture(scope="module")
def shards(tmp_path_factory, fineweb_texts) -> list[Path]:
    """Two train shards of real FineWeb tokens: 6,000 (11 steps) and 14,000 (27 steps)."""
    enc = gpt2_encoding(str(TOKENIZER_DIR))
    tokens: list[int] = []
    for text in fineweb_texts[:40]:
        tokens += [50256, *enc.encode_ordinary(text)]
    assert len(tokens) >= 20000
    tokens = np.array(tokens[:20000], dtype=np.uint16)
    out = tmp_path_factory.mktemp("tokens")
    files = [out / "train_000000.bin", out / "train_000001.bin"]
    write_shard(files[0], tokens[:6000])
    write_shard(files[1], tokens[6000:])
    return files


def loader(files: list[Path]) -> ShardLoader:
    return ShardLoader(files, **SHAPE, dp=SHARE)


def take(ld, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [ld.next_batch() for _ in range(steps * ld.micro_steps)]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True)
    )


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_same_batches_as_the_bare_loader_across_shards_and_epochs(shards):
    steps = 45  # 11 steps in shard 0, 27 in shard 1, then shard 0 again
    bare = take(loader(shards), steps)
    with Prefetcher(loader(shards), depth=3) as p:
        assert p.micro_steps == 2
        got = take(p, steps)
    assert same(got, bare)
    assert not torch.equal(bare[0][0], bare[2][0])  # the steps differ: the test can tell


def test_conversation_loader_batches_and_state_too():
    rng = np.random.default_rng(0)
    inputs = rng.integers(0, 50257, (40, 16), dtype=np.int32)
    targets = np.where(rng.random((40, 16)) < 0.5, -1, inputs)

    def conv() -> ConversationLoader:
        return ConversationLoader(
            inputs, targets, 2, 128, DataShare(1, 2), seed=3
        )  # 8 rows a step, 2 micro

    bare = conv()
    ref = take(bare, 12)  # 5 steps an epoch: over two epoch boundaries
    with Prefetcher(conv(), depth=4) as p:
        assert same(take(p, 12), ref)
        assert p.state_dict() == bare.state_dict() == {"epoch": 2, "step": 2}


@pytest.mark.parametrize("k", [0, 3, SHARD0_STEPS - 2, SHARD0_STEPS, 30])
def test_state_is_the_consumers_position_and_resumes_exactly(shards, k):
    bare = loader(shards)
    take(bare, k)
    expected, following = bare.state_dict(), take(bare, 6)

    p = Prefetcher(loader(shards), depth=16)  # 8 steps ahead: past the shard boundary for some k
    take(p, k)
    if k:
        wait_until(p._queue.full)  # the thread as far ahead as it goes
        ahead = (p.loader.shard, p.loader.pos)
        assert ahead != (expected["shard"], expected["pos"])  # the thread's position is not ours
    assert p.state_dict() == expected

    resumed = Prefetcher(loader(shards), depth=16)  # a fresh one, as after a restart
    resumed.load_state_dict(p.state_dict())
    assert same(take(resumed, 6), following)

    # the same one, seeking while its thread is ahead: back to the start, then to `expected`
    p.load_state_dict(loader(shards).state_dict())
    assert same(take(p, 2), take(loader(shards), 2))
    p.load_state_dict(expected)
    assert same(take(p, 6), following)
    p.close()
    resumed.close()


def test_state_only_between_steps(shards):
    with Prefetcher(loader(shards)) as p:
        p.next_batch()  # the first of 2 micro-batches
        with pytest.raises(AssertionError, match="between steps"):
            p.state_dict()
        p.next_batch()
        assert p.state_dict() == {"shard": 0, "pos": 512}


def test_pin_only_when_cuda_is_available(shards):
    """Pinned memory needs an accelerator (on a CPU-only build `pin_memory()` raises), so
    `pin=True` pins only where CUDA is; the batches are the same either way."""
    bare = take(loader(shards), 3)
    with Prefetcher(loader(shards), pin=True) as p:
        got = take(p, 3)
    assert same(got, bare)
    assert p.pin == torch.cuda.is_available()
    if torch.cuda.is_available():
        assert all(x.is_pinned() and y.is_pinned() for x, y in got)


def test_pinning_runs_on_the_thread_on_the_loops_device(shards, monkeypatch):
    """The pinning path without a GPU: CUDA's calls stood in for, to check what the thread does
    (pin each batch, after setting the loop's device in the thread, not GPU 0's default)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))

    def pin_memory(t: torch.Tensor) -> torch.Tensor:
        calls.append("pin")
        return t.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    bare = take(loader(shards), 2)
    with Prefetcher(loader(shards), depth=1, pin=True) as p:
        assert p.pin
        got = take(p, 2)
    assert same(got, bare)
    assert calls[0] == ("set_device", 3) and calls.count("pin") >= 2 * len(got)


def test_a_loader_error_is_raised_by_next_batch_where_the_bare_loader_raises_it(shards, tmp_path):
    files = [tmp_path / f.name for f in shards]
    for src, dst in zip(shards, files, strict=True):
        dst.write_bytes(src.read_bytes())
    bare, ahead = loader(files), Prefetcher(loader(files), depth=4)
    data = bytearray(files[1].read_bytes())
    data[:4] = b"\0\0\0\0"  # shard 1 goes bad once both loaders have read shard 0's header
    files[1].write_bytes(bytes(data))

    def until_error(ld) -> tuple[int, Exception]:
        for n in range(1000):
            try:
                ld.next_batch()
            except ShardError as e:
                return n, e
        raise AssertionError("no error")

    n_bare, e_bare = until_error(bare)
    n_ahead, e_ahead = until_error(ahead)
    assert n_ahead == n_bare == SHARD0_STEPS * 2 - 1  # the step that moves to shard 1
    assert str(e_ahead) == str(e_bare) and "bad magic" in str(e_ahead)
    assert str(files[1]) in str(e_ahead)
    with pytest.raises(ShardError, match="bad magic"):  # and again, not a hang
        ahead.next_batch()
    ahead.close()


def test_close_ends_the_thread_and_a_dropped_prefetcher_stops_too(shards):
    p = Prefetcher(loader(shards), depth=2)
    p.next_batch()
    thread = p._thread
    assert thread.daemon
    wait_until(p._queue.full)  # the thread waits on a full queue
    p.close()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        p.next_batch()
    p.close()  # twice is fine

    p = Prefetcher(loader(shards), depth=2)
    p.next_batch()
    thread = p._thread
    del p
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_an_open_prefetcher_does_not_keep_the_process_alive(shards):
    code = f"""
import sys
sys.path.insert(0, {str(REPO / "workflow")!r})
from lmpipe.data.loader import DataShare, ShardLoader
from lmpipe.data.prefetch import Prefetcher
keep = Prefetcher(
    ShardLoader({[str(f) for f in shards]!r}, **{json.dumps(SHAPE)}, dp=DataShare(1, 2)), depth=2
)
keep.next_batch()
print("done", flush=True)
"""  # exits with the thread running and its Prefetcher never closed
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
