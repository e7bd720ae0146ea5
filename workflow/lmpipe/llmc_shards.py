"""llm.c token shards: the one place that knows the file format.

A shard is a header of 256 little-endian int32 followed by the tokens:
    header[0] = magic, header[1] = version, header[2] = number of tokens,
with two formats, as llm.c's `dev/data/data_common.py` (`HEADERS_INFO`, `write_datafile`;
karpathy/llm.c) defines them:
    GPT-2:   magic 20240520, version 1, tokens as uint16 (a vocabulary of up to 65,536 ids);
    Llama-3: magic 20240801, version 7, tokens as uint32 (a larger vocabulary).
A writer picks the uint16 format whenever the vocabulary fits (`shard_format`), so GPT-2 shards
are byte-identical to llm.c's `dev/data/fineweb.py` output; readers take the dtype from the
header and check magic, version and size (llm.c's `train_gpt2.py` and `train_llama3.py`
`_load_data_shard` check the same), naming the file when one is wrong.

In the ground, so that every layer reads shards through it (the report counts the val text's
bytes a token, lmpipe.report.compression); lmpipe.data.shards re-exports it. A tokenized
dataset's `manifest.json`, which lists the shards, is lmpipe.manifests'.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmpipe.files import atomic_file

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


@dataclass(frozen=True)
class ShardFormat:
    """One of llm.c's shard formats: its header's magic and version, and its tokens' dtype."""

    name: str
    magic: int
    version: int
    dtype: np.dtype

    @property
    def max_token(self) -> int:
        return int(np.iinfo(self.dtype).max)


GPT2_FORMAT = ShardFormat("gpt-2", 20240520, 1, np.dtype("<u2"))
LLAMA3_FORMAT = ShardFormat("llama-3", 20240801, 7, np.dtype("<u4"))
FORMATS = {f.magic: f for f in (GPT2_FORMAT, LLAMA3_FORMAT)}


def shard_format(vocab_size: int) -> ShardFormat:
    """uint16 shards when every id of a `vocab_size` vocabulary fits in them, else uint32."""
    if vocab_size <= GPT2_FORMAT.max_token + 1:
        return GPT2_FORMAT
    if vocab_size <= LLAMA3_FORMAT.max_token + 1:
        return LLAMA3_FORMAT
    raise ValueError(f"a vocabulary of {vocab_size:,} tokens does not fit in uint32 shards")


class ShardError(ValueError):
    """A shard file that is not a valid llm.c shard; the message names the file."""


@dataclass(frozen=True)
class ShardHeader:
    """A checked shard header: its format and token count."""

    format: ShardFormat
    tokens: int


def header_bytes(num_tokens: int, fmt: ShardFormat = GPT2_FORMAT) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = fmt.magic, fmt.version, num_tokens
    return header.tobytes()


def write_shard(path: str | Path, tokens: np.ndarray, fmt: ShardFormat = GPT2_FORMAT) -> None:
    """Write `tokens` in `fmt` atomically: to `path.tmp`, then rename, so a crash leaves no
    half shard."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > fmt.max_token):
        raise ValueError(f"{path}: token ids must fit in {fmt.dtype.name} ({fmt.name} shards)")
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(header_bytes(len(tokens), fmt))
        f.write(tokens.astype(fmt.dtype, copy=False).tobytes())


def read_shard_header(path: str | Path) -> ShardHeader:
    """Check a shard's header and size; return its format and token count."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ShardError(f"{path}: shard file not found") from None
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    fmt = FORMATS.get(int(header[0]))
    if fmt is None:
        expected = " or ".join(str(m) for m in FORMATS)
        raise ShardError(f"{path}: bad magic {header[0]} (expected {expected}); not an llm.c shard")
    if header[1] != fmt.version:
        raise ShardError(
            f"{path}: unsupported version {header[1]} (expected {fmt.version} for magic"
            f" {fmt.magic})"
        )
    num_tokens = int(header[2])
    expected = HEADER_BYTES + num_tokens * fmt.dtype.itemsize
    if size != expected:
        raise ShardError(
            f"{path}: {size} bytes but the header says {num_tokens} {fmt.dtype.name} tokens"
            f" ({expected} bytes); truncated or corrupt"
        )
    return ShardHeader(fmt, num_tokens)


def read_header(path: str | Path) -> int:
    """Check a shard's header and size; return its token count."""
    return read_shard_header(path).tokens


def read_shard(path: str | Path, mmap: bool = True) -> np.ndarray:
    """The shard's tokens, uint16 or uint32 as its header says (memory-mapped by default:
    shards are 200 MB)."""
    header = read_shard_header(path)
    dtype = header.format.dtype
    if mmap:
        return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(header.tokens,))
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        return np.frombuffer(f.read(), dtype=dtype)
