"""Every `manifest.json` the pipeline writes: one dataclass a kind, one atomic write, one read.

A manifest describes a folder its stage wrote, and is written last (a reader that finds it may
trust the folder). The kinds, each with its writer and its reader here:
- raw (lmpipe.data.download): the downloaded `files` (file, bytes, rows, sha256), `source`;
- tokens (lmpipe.data.tokenize): the llm.c `shards` (file, split, tokens, sha256), `eot`, the
  `token_bytes` table (absent in data tokenized before it), `dataset`, `tokens_of`;
- mixture (lmpipe.data.mixture): a mixed dataset's tokens manifest, `mixture`: name -> weight and
  a source's tokens manifest (relative to it) instead of `shards`;
- conversations (lmpipe.chat.data): `kind: conversations`, `seq_len`, the arrays (`shards`: file,
  split, array, sha256) and the conversations a split `kept`;
- suite (lmpipe.eval.suite.data): the evaluation suite's `tasks` (folder, split, sha256, items);
- tokenizer (lmpipe.data.train_tokenizer): a trained tokenizer's `name`, `vocab_size`, `eot`.

`write` is the one write (atomic: a temporary name beside it, then renamed), `read_object` the
one read: a missing file, bad JSON, not an object or a missing key is a ManifestError naming the
file. The formats on disk are the writers' dicts, unchanged: older results folders still read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmpipe.files import write_text_atomic

MANIFEST = "manifest.json"

# GPT-2's <|endoftext|> id, defined here once (lmpipe.data.tokenizer's EOT_ID; the shards load
# without tiktoken): a tokens manifest without "eot" is in GPT-2's tokens
GPT2_EOT = 50256


class ManifestError(ValueError):
    """A manifest that is missing, not JSON or not of its kind; the message names the file."""


class ManifestNotFound(ManifestError, FileNotFoundError):
    """A manifest that is not there (a FileNotFoundError too, as a missing file is)."""


def write(path: str | Path, manifest: dict[str, Any], indent: int = 2) -> None:
    """`manifest` as JSON at `path`, atomically (each kind keeps the indent it always had)."""
    write_text_atomic(path, json.dumps(manifest, indent=indent) + "\n")


def read_object(path: str | Path, what: str) -> dict[str, Any]:
    """A manifest's JSON object; missing, bad JSON or not an object: a ManifestError naming the
    file and `what` it should be ("tokens manifest")."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ManifestNotFound(f"{path}: {what} not found") from None
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: not a {what} (a JSON {type(data).__name__})")
    return data


def _malformed(path: Path, what: str, expected: str, e: Exception) -> ManifestError:
    return ManifestError(f"{path}: not a {what} ({expected}; {type(e).__name__}: {e})")


# ---- raw ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawFile:
    file: Path
    rows: int
    bytes: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class RawManifest:
    path: Path
    files: list[RawFile]
    source: dict[str, Any] = field(default_factory=dict)


def read_raw(path: str | Path) -> RawManifest:
    path = Path(path)
    data = read_object(path, "raw manifest")
    try:
        files = [
            RawFile(path.parent / f["file"], f.get("rows", 0), f.get("bytes"), f.get("sha256"))
            for f in data["files"]
        ]
    except (KeyError, TypeError, AttributeError) as e:
        raise _malformed(path, "raw manifest", "`files`, each with `file`", e) from None
    return RawManifest(path, files, data.get("source") or {})


# ---- tokens -------------------------------------------------------------------------------------


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
    eot: int = GPT2_EOT  # the end-of-text id that opens each document (absent: GPT-2's)
    # each token id's UTF-8 bytes (lmpipe.data.token_bytes); None: tokenized before the table
    # was written, and its val losses have no bits per byte
    token_bytes: Path | None = None
    dataset: str | None = None  # the `datasets:` entry tokenized
    tokens_of: str | None = None  # an `arch: hf` model whose own tokens these are; None: GPT-2's
    tokenizer: str | None = None  # "gpt2", or "hf <sha256 of its files>"

    def files(self, split: str) -> list[Path]:
        """The shard files of `split` ('train' or 'val'), in order; none is an error."""
        files = [s.file for s in self.shards if s.split == split]
        if not files:
            raise ValueError(f"{self.path}: no '{split}' shards listed")
        return files

    def tokens(self, split: str) -> int:
        """The tokens the manifest lists for `split` (0 where it gives no counts)."""
        return sum(s.tokens or 0 for s in self.shards if s.split == split)

    def identity(self) -> list[str]:
        """The shards' identities, in order: the data's, in a run's settings hash."""
        return [s.identity for s in self.shards]

    def byte_table(self) -> np.ndarray | None:
        """Each token id's bytes (int64), or None where the manifest names no table."""
        if self.token_bytes is None:
            return None
        table = np.load(self.token_bytes, allow_pickle=False)
        return table.astype(np.int64)


def read_tokens(path: str | Path) -> TokensManifest:
    """A tokens manifest.json: its shards (`file` and `split` required; `tokens`, `sha256`)."""
    path = Path(path)
    data = read_object(path, "tokens manifest")
    try:
        shards = [
            ManifestShard(path.parent / s["file"], s["split"], s.get("tokens"), s.get("sha256"))
            for s in data["shards"]
        ]
    except (KeyError, TypeError, AttributeError) as e:
        expected = "`shards`, each with `file` and `split`"
        raise _malformed(path, "tokens manifest", expected, e) from None
    table = data.get("token_bytes")
    table_file = path.parent / table["file"] if isinstance(table, dict) else None
    return TokensManifest(
        path, shards, data.get("eot", GPT2_EOT), table_file, data.get("dataset"),
        data.get("tokens_of"), data.get("tokenizer"),
    )  # fmt: skip


# ---- mixture ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MixtureManifest:
    """A mixed dataset's tokens manifest: each source's weight and tokens manifest."""

    path: Path
    dataset: str
    sources: dict[str, tuple[float, Path]]  # name -> (weight, its tokens manifest)
    tokens_of: str | None = None


def is_mixture(path: str | Path) -> bool:
    """Whether a tokens manifest is a mixture's (it lists sources, not shards)."""
    return "mixture" in read_object(path, "tokens manifest")


def dataset_of(path: str | Path) -> str:
    """The `datasets:` entry a tokens manifest (a mixture's too) holds: its `dataset`, else its
    folder's (results/data/{dataset}/tokens/manifest.json)."""
    path = Path(path)
    return read_object(path, "tokens manifest").get("dataset", path.parent.parent.name)


def tokens_of(path: str | Path) -> str | None:
    """The model whose own tokens a tokens manifest holds (None: GPT-2's)."""
    return read_object(path, "tokens manifest").get("tokens_of")


def read_mixture(path: str | Path) -> MixtureManifest:
    path = Path(path)
    data = read_object(path, "mixture manifest")
    try:
        sources = {
            n: (float(e["weight"]), path.parent / e["manifest"]) for n, e in data["mixture"].items()
        }
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        expected = "`mixture`: name -> weight and manifest"
        raise _malformed(path, "mixture manifest", expected, e) from None
    dataset = data.get("dataset", path.parent.parent.name)
    return MixtureManifest(path, dataset, sources, data.get("tokens_of"))


# ---- conversations ------------------------------------------------------------------------------


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


def read_conversations(path: str | Path) -> ConversationsManifest:
    """A conversations manifest.json (`kind: conversations`, `seq_len`, `shards` each with
    `file`, `split` and `array`)."""
    path = Path(path)
    m = read_object(path, "conversations manifest")
    if m.get("kind") != "conversations":
        raise ManifestError(f"{path}: not a conversations manifest (kind {m.get('kind')!r})")
    try:
        arrays = [
            ManifestArray(path.parent / s["file"], s["split"], s["array"], s.get("sha256"))
            for s in m["shards"]
        ]
        return ConversationsManifest(path, int(m["seq_len"]), arrays, dict(m.get("kept", {})))
    except (KeyError, TypeError, AttributeError) as e:
        expected = "`seq_len`, `shards` each with `file`, `split` and `array`"
        raise _malformed(path, "conversations manifest", expected, e) from None


# ---- the evaluation suite -----------------------------------------------------------------------


@dataclass(frozen=True)
class SuiteManifest:
    path: Path
    tasks: dict[str, dict[str, Any]]  # name -> folder, split, sha256, items (, subjects)
    source: str | None = None
    package: str | None = None  # the package the tasks' files came from ("name==version")

    def folder(self, task: str) -> Path | None:
        """A task's folder, beside the manifest; None where the manifest lists no such task."""
        entry = self.tasks.get(task)
        return None if entry is None else self.path.parent / entry["folder"]


def read_suite(path: str | Path) -> SuiteManifest:
    path = Path(path)
    data = read_object(path, "suite manifest")
    tasks = data.get("tasks")
    if not isinstance(tasks, dict):
        raise ManifestError(f"{path}: not a suite manifest (`tasks`: name -> folder)")
    return SuiteManifest(path, tasks, data.get("source"), data.get("package"))


# ---- a trained tokenizer ------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizerManifest:
    path: Path
    name: str
    vocab_size: int
    eot: int | None = None


def read_tokenizer(path: str | Path) -> TokenizerManifest:
    path = Path(path)
    data = read_object(path, "tokenizer manifest")
    try:
        return TokenizerManifest(path, data["name"], int(data["vocab_size"]), data.get("eot"))
    except (KeyError, TypeError, ValueError) as e:
        raise _malformed(path, "tokenizer manifest", "`name`, `vocab_size`", e) from None
