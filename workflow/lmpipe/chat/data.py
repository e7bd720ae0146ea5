"""Conversations for chat fine-tuning (SFT): ShareGPT JSON -> Vicuna template -> masked rows.

    python -m lmpipe.chat prepare --config-json J --tokenizer resources/gpt2 \
        --out results/data/D/sft

`J` is `lmpipe.config.conversations_params(config, dataset)`: where the conversations come from
(a local ShareGPT JSON file, or a Hugging Face dataset through `datasets`), the template, the
held-out share, what to do with a malformed conversation, and the sequence length.

The template is FastChat's `vicuna_v1.1` (lmpipe.chat.template). The loss counts the assistant's
replies and the end-of-text closing each (so the model learns to stop), nothing else: as
FastChat's train.py, which masks the system line, every "USER: ..." and every "ASSISTANT:".

Output (no pickle): `{split}_inputs.npy` and `{split}_targets.npy`, int32 arrays (rows, seq_len) for
split train and val; one conversation a row, padded with end-of-text (inputs) and -1 (targets);
`targets[i, t]` is the token after `inputs[i, t]`, or -1 where it does not count. `manifest.json`
has the counts: conversations read, kept a split, skipped (malformed, too long), truncated.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmpipe import manifests
from lmpipe.chat.template import (
    TEMPLATES,
    MalformedConversation,
    check_conversation,
    check_template,
    encode_exchange,
    segments,
    start_ids,
)
from lmpipe.config import ConversationsConfig, build
from lmpipe.data.tokenizer import Tokenizer, load_tokenizer
from lmpipe.files import atomic_dir, sha256_file

IGNORE = -1  # the target of a token that does not count (the model's cross_entropy ignore_index)
SPLITS = ("train", "val")
MAX_LISTED_IDS = 50  # ids of skipped/truncated conversations kept in the manifest

# ----------------------------------------------------------------------------------------------
# conversations -> rows


@dataclass
class Row:
    inputs: np.ndarray  # (seq_len,) int32
    targets: np.ndarray  # (seq_len,) int32, IGNORE where the loss does not count
    truncated: bool


def to_row(enc: Tokenizer, turns: list[tuple[str, str]], seq_len: int) -> Row | None:
    """One fixed-length row; None when not even part of the first reply fits.

    Too long: whole leading exchanges are kept and the rest dropped; when the first exchange alone
    is too long it is cut at the end (its reply's first tokens still count).
    """
    ids: list[int] = start_ids(enc)  # <s> where the tokenizer has one: never counted
    counts: list[bool] = [False] * len(ids)
    truncated = False
    for k, exchange in enumerate(segments(turns)):
        e_ids, e_counts = encode_exchange(enc, exchange)
        if len(ids) + len(e_ids) > seq_len + 1:  # seq_len inputs and their next tokens
            truncated = True
            if k == 0:
                ids, counts = (ids + e_ids)[: seq_len + 1], (counts + e_counts)[: seq_len + 1]
            break
        ids, counts = ids + e_ids, counts + e_counts
    targets = [t if c else IGNORE for t, c in zip(ids[1:], counts[1:], strict=True)]
    if all(t == IGNORE for t in targets):
        return None
    n = len(ids) - 1
    row_in = np.full(seq_len, enc.eot_token, dtype=np.int32)
    row_tg = np.full(seq_len, IGNORE, dtype=np.int32)
    row_in[:n], row_tg[:n] = ids[:-1], targets
    return Row(row_in, row_tg, truncated)


def split_of(cid: str, val_percent: float) -> str:
    """A fixed split by id hash: the same conversation is held out whatever else the file holds."""
    bucket = int(hashlib.sha256(cid.encode()).hexdigest()[:8], 16) % 10000
    return "val" if bucket < val_percent * 100 else "train"


@dataclass
class Prepared:
    rows: dict[str, list[Row]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    conversations: int = 0
    malformed: list[str] = field(default_factory=list)
    too_long: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    tokenizer: str = ""  # the tokenizer's name (lmpipe.data.tokenizer.Tokenizer)
    eot: int = -1  # its end of text: the padding of the rows' inputs


def prepare(records: Iterable[Any], cfg: ConversationsConfig, enc: Tokenizer) -> Prepared:
    """Check, render, tokenize, mask and split the conversations."""
    if cfg.template not in TEMPLATES:
        raise ValueError(f"template {cfg.template!r} unknown; known: {', '.join(TEMPLATES)}")
    check_template(enc, f"datasets.{cfg.dataset}: tokenizer {enc.name}")
    out = Prepared(tokenizer=enc.name, eot=enc.eot_token)
    for index, record in enumerate(records):
        out.conversations += 1
        try:
            cid, turns = check_conversation(record, index)
        except MalformedConversation as e:
            if cfg.on_malformed == "error":
                raise MalformedConversation(
                    f"datasets.{cfg.dataset}: {e} (set on_malformed: skip to skip such ones)"
                ) from None
            print(f"skipped: {e}")
            out.malformed.append(str(e))
            continue
        row = to_row(enc, turns, cfg.seq_len)
        if row is None:
            out.too_long.append(cid)
            continue
        if row.truncated:
            out.truncated.append(cid)
        out.rows[split_of(cid, cfg.val_percent)].append(row)
    for split in SPLITS:
        if not out.rows[split]:
            raise ValueError(
                f"datasets.{cfg.dataset}: no {split} conversations left out of"
                f" {out.conversations} (val_percent {cfg.val_percent})"
            )
    return out


# ----------------------------------------------------------------------------------------------
# reading the source and writing the arrays


def read_records(cfg: ConversationsConfig) -> Iterable[Any]:
    """ShareGPT records from a local JSON (list) / JSON-lines file, or a Hugging Face dataset."""
    if cfg.source == "local":
        path = Path(cfg.path)
        if not path.is_file():
            raise FileNotFoundError(f"datasets.{cfg.dataset}.path: {path} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as as_list:
            data = []
            for lineno, line in enumerate(text.splitlines(), start=1):
                try:
                    data += [json.loads(line)] if line.strip() else []
                except json.JSONDecodeError as e:
                    raise ValueError(
                        f"{path}: neither a JSON list (line {as_list.lineno}: {as_list.msg})"
                        f" nor JSON lines (line {lineno}: {e.msg})"
                    ) from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of conversations")
        return data
    from datasets import load_dataset  # the hub (or its local cache); not in the default DAG

    return load_dataset(cfg.repo, cfg.name, split=cfg.split, revision=cfg.revision)


def write(prepared: Prepared, cfg: ConversationsConfig, out: Path) -> dict[str, Any]:
    """The arrays and manifest.json into `out` (written as `out.tmp`, then renamed)."""
    with atomic_dir(out) as tmp:
        return _write(prepared, cfg, tmp)


def _write(prepared: Prepared, cfg: ConversationsConfig, tmp: Path) -> dict[str, Any]:
    shards, rows, targets = [], {}, {}
    for split in SPLITS:
        r = prepared.rows[split]
        arrays = {
            "inputs": np.stack([row.inputs for row in r]),
            "targets": np.stack([row.targets for row in r]),
        }
        rows[split] = len(r)
        targets[split] = int((arrays["targets"] != IGNORE).sum())
        for kind, array in arrays.items():
            name = f"{split}_{kind}.npy"
            np.save(tmp / name, array, allow_pickle=False)
            shards.append(
                {"file": name, "split": split, "array": kind, "rows": len(r),
                 "sha256": sha256_file(tmp / name)}
            )  # fmt: skip
    manifest = {
        "dataset": cfg.dataset,
        "kind": "conversations",
        "template": cfg.template,
        "tokenizer": prepared.tokenizer,
        "eot": prepared.eot,
        "ignore_index": IGNORE,
        "seq_len": cfg.seq_len,
        "val_percent": cfg.val_percent,
        "on_malformed": cfg.on_malformed,
        "conversations": prepared.conversations,
        "kept": rows,
        "target_tokens": targets,  # the tokens the loss counts
        "skipped": {"malformed": len(prepared.malformed), "too_long": len(prepared.too_long)},
        "truncated": len(prepared.truncated),
        "malformed_examples": prepared.malformed[:MAX_LISTED_IDS],
        "too_long_ids": prepared.too_long[:MAX_LISTED_IDS],
        "truncated_ids": prepared.truncated[:MAX_LISTED_IDS],
        "shards": shards,
    }
    manifests.write(tmp / manifests.MANIFEST, manifest, indent=1)
    return manifest


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config-json", required=True, help="the dataset's conversations_params")
    p.add_argument(
        "--tokenizer",
        required=True,
        help="GPT-2's encoder.json and vocab.bpe, a base model's folder or a trained tokenizer's",
    )
    p.add_argument("--out", required=True, type=Path, help="folder to write (arrays + manifest)")
    args = p.parse_args(argv)
    params = json.loads(args.config_json)
    params.pop("tokenizer", None)  # the tokenizer's identity: the rule's cache key, read here
    cfg = build(ConversationsConfig, params, "datasets")
    prepared = prepare(read_records(cfg), cfg, load_tokenizer(args.tokenizer))
    m = write(prepared, cfg, args.out)
    print(
        f"{cfg.dataset}: {m['conversations']} conversations -> {m['kept']['train']} train +"
        f" {m['kept']['val']} val rows of {cfg.seq_len} tokens; skipped {m['skipped']};"
        f" truncated {m['truncated']}; loss tokens {m['target_tokens']}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
