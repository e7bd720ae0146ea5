"""Writing files so that a crash never leaves a half-written one that looks whole, and hashing them.

Every stage writes its outputs through these: a file or folder appears under its final name only
when complete (written under a temporary name beside it, then renamed, which is atomic on one
filesystem). A reader that finds it may trust it. The distributed checkpoints have their own
multi-rank version (lmpipe.train.checkpoint.atomic_folder); everything else uses these.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TMP_SUFFIX = ".tmp"


def tmp_path(path: str | Path) -> Path:
    """Where `path` is written before it is complete: `path.tmp`, beside it (same filesystem)."""
    path = Path(path)
    return path.with_name(path.name + TMP_SUFFIX)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write; it becomes `path` when the block ends without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder; it replaces `path` (old contents and all) at the end.

    An interrupted write leaves `path` as it was, and the next attempt clears the temporary one.
    """
    path = Path(path)
    tmp = tmp_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks (shards and parquet files are hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_json_lines(path: str | Path) -> tuple[list[tuple[int, Any]], tuple[int, str] | None]:
    """A JSON-lines file's values with their line numbers, and its last line (number, text) if
    that one is torn (else None). A kill mid-write (SIGKILL, a node lost) or a writer still at
    it leaves a torn last line: left out. A broken line elsewhere is no kill's doing: an error
    naming the file and line. Blank lines are skipped."""
    lines = Path(path).read_text().splitlines()
    values = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            values.append((i, json.loads(line)))
        except json.JSONDecodeError as e:
            if i == len(lines):
                return values, (i, line)
            raise ValueError(f"{path}:{i}: not valid JSON ({e})") from None
    return values, None
