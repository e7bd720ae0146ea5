"""A Hugging Face model folder as `model.arch: hf` reads it, without torch: where it is, whether
it holds a causal LM the trainer can load, and the parameters its weights hold (its shape is
measured: lmpipe.hf_config).

The config check calls `check_folder` on every `arch: hf` entry's local folder, so a path with
no model, a model that is not a causal LM, a pickle-only checkpoint or a tokenizer whose ids the
model's embedding cannot hold is one line naming the file, before any job starts. Nothing is
downloaded here (no network at run time): a hub id must already be in the local Hugging Face
cache.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


def resolve(path: str, revision: str | None = None) -> Path:
    """The local folder of `path`: itself, or a hub id's snapshot in the local cache."""
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    if p.is_absolute() or path.startswith(".") or path.count("/") != 1:
        raise ValueError(f"{path}: no such folder")
    snapshot = cached_snapshot(path, revision or "main")
    if snapshot is None:
        raise ValueError(
            f"{path}: neither a folder nor a hub id in the local Hugging Face cache (jobs never"
            f" download: fetch it first, e.g. `hf download {path}`)"
        )
    return snapshot


def cached_snapshot(repo_id: str, revision: str) -> Path | None:
    """A hub model's snapshot folder in the Hugging Face cache, read from the cache's documented
    layout (huggingface_hub's guides/manage-cache: hub/models--ORG--NAME/refs/REVISION holds the
    commit, snapshots/COMMIT the files), so the config check needs no hub client in any env."""
    import os

    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub"))
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision  # a commit given as is
    snapshot = repo / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"{path}: missing: {folder} holds no Hugging Face model")
    return json.loads(path.read_text())


def check_folder(folder: Path, trust_remote_code: bool = False) -> dict[str, Any]:
    """The folder's config.json, once it is known to describe a decoder-only causal LM whose
    weights are safetensors and whose tokenizer fits the embedding."""
    cfg = read_config(folder)
    archs = cfg.get("architectures") or []
    if cfg.get("is_encoder_decoder") or not any(
        a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs
    ):
        raise ValueError(
            f"{folder / 'config.json'}: architectures {archs} is not a decoder-only causal LM"
            " (a *ForCausalLM or *LMHeadModel class)"
        )
    if cfg.get("auto_map") and not trust_remote_code:
        raise ValueError(
            f"{folder / 'config.json'}: the model's code lives in the folder (auto_map); set the"
            " model's trust_remote_code: true to run it"
        )
    if not any((folder / name).is_file() for name in SAFETENSORS):
        pickles = [name for name in PICKLES if (folder / name).is_file()]
        problem = (
            f"only {', '.join(pickles)}: pickle checkpoints are never loaded; convert it to"
            " safetensors first"
            if pickles
            else "no weights"
        )
        raise ValueError(f"{folder / 'model.safetensors'}: missing ({problem})")
    found = tokenizer_top_id(folder)
    if found is not None and found[1] >= cfg["vocab_size"]:
        file, top = found
        raise ValueError(
            f"{file}: token id {top} does not fit the model's vocab_size {cfg['vocab_size']}"
            " (config.json): the tokenizer is not the model's"
        )
    return cfg


def tokenizer_top_id(folder: Path) -> tuple[Path, int] | None:
    """The largest token id the folder's tokenizer can produce, and the file that holds it,
    over every layout AutoTokenizer reads: tokenizer.json (its vocabulary and added tokens), a
    byte-level BPE's vocab.json or encoder.json, added_tokens.json, and tokenizer_config.json's
    added_tokens_decoder. None: no such file (a SentencePiece tokenizer.model alone is not read
    here)."""
    found: list[tuple[int, Path]] = []
    for name in ("tokenizer.json", "vocab.json", "encoder.json", "added_tokens.json",
                 "tokenizer_config.json"):  # fmt: skip
        path = folder / name
        if path.is_file():
            ids = file_ids(json.loads(path.read_text()), name)
            found += [(max(ids), path)] if ids else []
    if not found:
        return None
    top, path = max(found, key=lambda f: f[0])
    return path, top


def file_ids(data: Any, name: str) -> list[int]:
    """The token ids one tokenizer file lists (file_ids of tokenizer_top_id's files)."""
    if name == "tokenizer.json":
        vocab = (data.get("model") or {}).get("vocab") or {}
        ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
        return ids + [t["id"] for t in data.get("added_tokens") or []]
    if name == "tokenizer_config.json":
        return [int(i) for i in data.get("added_tokens_decoder") or {}]
    return [int(i) for i in data.values()] if isinstance(data, dict) else []


TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "encoder.json", "vocab.bpe",
)  # fmt: skip


def tokenizer_identity(folder: str | Path) -> str:
    """sha256 over a folder's tokenizer files: what prepared data's cache keys on."""
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(folder) / name
        if path.is_file():
            h.update(name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    return [folder / "model.safetensors"]


def num_params(folder: Path) -> int:
    """Parameters stored in the folder's safetensors files (a tied head once), read from their
    headers (the format's 8-byte length then JSON): no torch, no weights read."""
    n = 0
    for path in safetensors_files(folder):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for key, t in header.items():
            if key != "__metadata__":
                count = 1
                for d in t["shape"]:
                    count *= d
                n += count
    return n
