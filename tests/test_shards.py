"""The llm.c shard format as readers meet it: memory-mapped, read-only, exactly llm.c's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from lmpipe.data import shards


def llmc_shard(path, tokens) -> None:
    """A shard written as llm.c's `dev/data/data_common.write_datafile` writes one."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(tokens, dtype=np.uint16).tobytes())


def test_an_llmc_shard_reads_back_memory_mapped_by_default(tmp_path):
    """Shards are 200 MB: read_shard maps the file unless asked not to."""
    path = tmp_path / "s.bin"
    llmc_shard(path, [50256, 1, 2, 3, 65535])
    tokens = shards.read_shard(path)
    assert isinstance(tokens, np.memmap)
    assert tokens.dtype == np.uint16
    assert tokens.tolist() == [50256, 1, 2, 3, 65535]
    assert not isinstance(shards.read_shard(path, mmap=False), np.memmap)


@pytest.mark.parametrize("mmap", [True, False])
def test_reading_never_writes_to_the_shard(tmp_path, mmap):
    """The tokens a reader gets are read-only: a stray write cannot corrupt the data set."""
    path = tmp_path / "s.bin"
    llmc_shard(path, [7, 8, 9])
    before = path.read_bytes()
    tokens = shards.read_shard(path, mmap=mmap)
    with pytest.raises(ValueError, match="read-only"):
        tokens[0] = 1
    assert path.read_bytes() == before


@pytest.mark.parametrize("n", [0, 1, 3])
def test_odd_and_empty_token_counts_round_trip(tmp_path, n):
    """A shard of any length, odd (not a whole number of int32) or empty, reads back exactly."""
    path = tmp_path / "s.bin"
    tokens = np.arange(n, dtype=np.uint16) * 1000
    shards.write_shard(path, tokens)
    assert path.stat().st_size == 1024 + 2 * n
    assert shards.read_header(path) == n
    assert shards.read_shard(path).tolist() == tokens.tolist()
