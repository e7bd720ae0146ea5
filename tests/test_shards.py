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


# ---- uint32 shards (a vocabulary over 65,536 ids) -----------------------------------------------


def llmc_read(path) -> np.ndarray:
    """A shard read as llm.c's `train_llama3.py` `_load_data_shard` reads one (karpathy/llm.c),
    independently of lmpipe: magic 20240801, version 7, then uint32 tokens, count checked."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(256 * 4), dtype=np.int32)
        assert header[0] == 20240801, "magic number mismatch in the data .bin file"
        assert header[1] == 7, "unsupported version"
        ntok = header[2]
        tokens = np.frombuffer(f.read(), dtype=np.uint32)
    assert len(tokens) == ntok, "number of tokens read does not match header?"
    return tokens


def test_a_large_vocabulary_gets_uint32_shards_that_llmc_reads(tmp_path):
    """Llama-3's 128,256 ids need uint32: llm.c's (20240801, 7) format, read back by our reader
    (dtype from the header) and by llm.c's own reader."""
    fmt = shards.shard_format(128_256)
    assert (fmt.magic, fmt.version, fmt.dtype) == (20240801, 7, np.dtype("<u4"))
    tokens = np.array([128_000, 0, 65_535, 65_536, 128_255, 7], dtype=np.int64)
    path = tmp_path / "s.bin"
    shards.write_shard(path, tokens, fmt)
    assert path.stat().st_size == 1024 + 4 * len(tokens)
    assert llmc_read(path).tolist() == tokens.tolist()
    for mmap in (True, False):
        back = shards.read_shard(path, mmap=mmap)
        assert back.dtype == np.uint32
        assert back.tolist() == tokens.tolist()
    assert shards.read_header(path) == len(tokens)


@pytest.mark.parametrize(
    ("vocab", "fmt"),
    [(50_257, shards.GPT2_FORMAT), (65_536, shards.GPT2_FORMAT), (65_537, shards.LLAMA3_FORMAT)],
)
def test_uint16_shards_while_the_vocabulary_fits(vocab, fmt):
    """GPT-2's shards stay llm.c's uint16 format (tests/test_data.py pins their bytes)."""
    assert shards.shard_format(vocab) == fmt


def test_uint32_shard_with_a_uint16_size_names_the_file(tmp_path):
    """A uint32 header over uint16-sized data is caught by its size, naming the file."""
    path = tmp_path / "big_train_000001.bin"
    shards.write_shard(path, np.arange(10), shards.LLAMA3_FORMAT)
    path.write_bytes(path.read_bytes()[: 1024 + 2 * 10])
    with pytest.raises(shards.ShardError, match=f"{path}.*10 uint32 tokens.*truncated"):
        shards.read_shard(path)


def test_version_of_the_other_format_names_the_file(tmp_path):
    """Magic and version go together: uint32's magic with uint16's version 1 is refused."""
    path = tmp_path / "s.bin"
    shards.write_shard(path, np.arange(4), shards.LLAMA3_FORMAT)
    raw = bytearray(path.read_bytes())
    raw[4:8] = np.array([1], dtype="<i4").tobytes()
    path.write_bytes(bytes(raw))
    with pytest.raises(shards.ShardError, match=f"{path}.*version 1 .*expected 7"):
        shards.read_header(path)


def test_ids_beyond_uint16_refused_in_gpt2_shards_and_beyond_uint32_vocabularies(tmp_path):
    with pytest.raises(ValueError, match="uint16"):
        shards.write_shard(tmp_path / "s.bin", np.array([65_536]))
    with pytest.raises(ValueError, match="does not fit in uint32"):
        shards.shard_format(2**32 + 1)
