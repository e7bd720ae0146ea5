"""llm.c token shards: the one place that knows the file format.

A shard is a header of 256 little-endian int32 followed by the tokens as uint16:
    header[0] = 20240520 (magic), header[1] = 1 (version), header[2] = number of tokens.
This is what llm.c's `dev/data/fineweb.py` writes and `train_gpt2.py` reads, so shards
interchange with llm.c. Readers check magic, version and size, and name the file when one is wrong.

A tokenized dataset's `manifest.json` lists its shards in order, each with its split, tokens and
sha256; `read_manifest` is its one reader (the loaders, the val-loss evaluation, the data's
identity in the settings hash).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmpipe.files import atomic_file, read_json

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")
MAX_TOKEN = np.iinfo(TOKEN_DTYPE).max


class ShardError(ValueError):
    """A shard file that is not a valid llm.c shard; the message names the file."""


def header_bytes(num_tokens: int) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, num_tokens
    return header.tobytes()


def write_shard(path: str | Path, tokens: np.ndarray) -> None:
    """Write `tokens` atomically: to `path.tmp`, then rename, so a crash leaves no half shard."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > MAX_TOKEN):
        raise ValueError(f"{path}: token ids must fit in uint16")
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(header_bytes(len(tokens)))
        f.write(tokens.astype(TOKEN_DTYPE, copy=False).tobytes())


def read_header(path: str | Path) -> int:
    """Check a shard's header and size; return its token count."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ShardError(f"{path}: shard file not found") from None
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC:
        raise ShardError(f"{path}: bad magic {header[0]} (expected {MAGIC}); not an llm.c shard")
    if header[1] != VERSION:
        raise ShardError(f"{path}: unsupported version {header[1]} (expected {VERSION})")
    num_tokens = int(header[2])
    expected = HEADER_BYTES + num_tokens * TOKEN_DTYPE.itemsize
    if size != expected:
        raise ShardError(
            f"{path}: {size} bytes but the header says {num_tokens} tokens ({expected} bytes);"
            " truncated or corrupt"
        )
    return num_tokens


def read_shard(path: str | Path, mmap: bool = True) -> np.ndarray:
    """The shard's tokens as a uint16 array (memory-mapped by default: shards are 200 MB)."""
    num_tokens = read_header(path)
    if mmap:
        return np.memmap(
            path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(num_tokens,)
        )
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        return np.frombuffer(f.read(), dtype=TOKEN_DTYPE)


@dataclass(frozen=True)
class ManifestShard:
    """A shard as the tokens manifest lists it; `file` is the shard's path."""

    file: Path
    split: str  # "val" or "train"
    tokens: int | None
    sha256: str | None

    @property
    def identity(self) -> str:
        """What names the shard's content: its sha256 (its file name where none is listed)."""
        return self.sha256 if self.sha256 is not None else self.file.name


@dataclass(frozen=True)
class TokensManifest:
    path: Path
    shards: list[ManifestShard]

    def files(self, split: str) -> list[Path]:
        """The shard files of `split` ('train' or 'val'), in order; none is an error."""
        files = [s.file for s in self.shards if s.split == split]
        if not files:
            raise ValueError(f"{self.path}: no '{split}' shards listed")
        return files

    def identity(self) -> list[str]:
        """The shards' identities, in order: the data's, in a run's settings hash."""
        return [s.identity for s in self.shards]


def read_manifest(path: str | Path) -> TokensManifest:
    """A tokens manifest.json: its shards (`file` and `split` required; `tokens`, `sha256`).
    A missing file, bad JSON or a missing key is an error naming the file."""
    path = Path(path)
    data = read_json(path, "tokens manifest")
    try:
        shards = [
            ManifestShard(path.parent / s["file"], s["split"], s.get("tokens"), s.get("sha256"))
            for s in data["shards"]
        ]
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{path}: not a tokens manifest (`shards`, each with `file` and `split`;"
            f" {type(e).__name__}: {e})"
        ) from None
    return TokensManifest(path, shards)
