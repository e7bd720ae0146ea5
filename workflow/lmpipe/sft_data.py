"""Conversations for chat fine-tuning (SFT): ShareGPT JSON -> Vicuna template -> masked token rows.

    python -m lmpipe.sft_data --config-json J --tokenizer resources/gpt2 --out results/data/D/sft

`J` is `lmpipe.config.sft_data_params(config, dataset)`: where the conversations come from (a local
ShareGPT JSON file, or a Hugging Face dataset through `datasets`), the template, the held-out
share, what to do with a malformed conversation, and the sequence length.

The template is FastChat's `vicuna_v1.1` (conversation.py, `SeparatorStyle.ADD_COLON_TWO`,
sep=" ", sep2="</s>"), with GPT-2's `<|endoftext|>` as `</s>`:

    {system} USER: {human} ASSISTANT: {gpt}<|endoftext|>USER: {human} ASSISTANT: {gpt}<|endoftext|>

The loss counts the assistant's replies and the end-of-text closing each (so the model learns to
stop), nothing else: as FastChat's train.py, which masks the system line, every "USER: ..." and
every "ASSISTANT:". With GPT-2's BPE the space after "ASSISTANT:" belongs to the reply's first token
(" I"), so a generation prompt ends with "ASSISTANT:" exactly as FastChat's does.

Output (no pickle): `{split}_inputs.npy` and `{split}_targets.npy`, int32 arrays (rows, seq_len) for
split train and val; one conversation a row, padded with end-of-text (inputs) and -1 (targets);
`targets[i, t]` is the token after `inputs[i, t]`, or -1 where it does not count. `manifest.json`
has the counts: conversations read, kept a split, skipped (malformed, too long), truncated.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmpipe.config import ConversationsConfig, from_dict
from lmpipe.tokenizer import EOT, EOT_ID, gpt2_encoding

# FastChat's vicuna_v1.1 template
SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)
ROLES = {"human": "USER", "gpt": "ASSISTANT"}
TEMPLATES = ("vicuna_v1.1",)
IGNORE = -1  # the target of a token that does not count (the model's cross_entropy ignore_index)
SPLITS = ("train", "val")
MAX_LISTED_IDS = 50  # ids of skipped/truncated conversations kept in the manifest


class MalformedConversation(ValueError):
    """A conversation that is not human/gpt turns in order; the message names its id."""


# ----------------------------------------------------------------------------------------------
# the template


def check_conversation(record: Any, index: int) -> tuple[str, list[tuple[str, str]]]:
    """(id, [(role, text), ...]) of one ShareGPT record, or MalformedConversation naming it."""
    if not isinstance(record, dict):
        raise MalformedConversation(f"conversation #{index}: not an object")
    cid = str(record.get("id", f"#{index}"))
    turns = record.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise MalformedConversation(f"conversation {cid!r}: no turns")
    out = []
    for i, turn in enumerate(turns):
        role = turn.get("from") if isinstance(turn, dict) else None
        text = turn.get("value") if isinstance(turn, dict) else None
        if role not in ROLES:
            raise MalformedConversation(f"conversation {cid!r}, turn {i}: unknown role {role!r}")
        expected = "human" if i % 2 == 0 else "gpt"
        if role != expected:
            raise MalformedConversation(
                f"conversation {cid!r}, turn {i}: {role!r} where {expected!r} was expected"
                " (turns must alternate human, gpt, starting with human)"
            )
        if not isinstance(text, str) or not text.strip():
            raise MalformedConversation(f"conversation {cid!r}, turn {i}: empty message")
        out.append((role, text))
    if out[-1][0] != "gpt":
        raise MalformedConversation(f"conversation {cid!r}: ends with a human turn, no reply")
    return cid, out


def segments(turns: list[tuple[str, str]]) -> list[list[tuple[str, bool]]]:
    """The rendered text, one list a human/gpt exchange, as (text, counts in the loss) pieces.

    The first exchange starts with the system line; EOT pieces stand for the end-of-text token.
    """
    exchanges = []
    for i in range(0, len(turns), 2):
        prompt = (SYSTEM + " " if i == 0 else "") + f"USER: {turns[i][1]} ASSISTANT:"
        exchanges.append([(prompt, False), (" " + turns[i + 1][1], True), (EOT, True)])
    return exchanges


def render(turns: list[tuple[str, str]]) -> str:
    """The whole conversation as text (end-of-text written as `<|endoftext|>`)."""
    return "".join(text for ex in segments(turns) for text, _ in ex)


def generation_prompt(history: list[tuple[str, str]], message: str) -> str:
    """The text a model continues to answer `message` after `history` (human, gpt pairs)."""
    turns = [t for pair in history for t in (("human", pair[0]), ("gpt", pair[1]))]
    return render(turns) + (SYSTEM + " " if not history else "") + f"USER: {message} ASSISTANT:"


def prompt_ids(
    encode: Callable[[str], list[int]], history: list[tuple[str, str]], message: str
) -> list[int]:
    """Token ids of `generation_prompt` (end-of-text as its token, never as text)."""
    turns = [t for pair in history for t in (("human", pair[0]), ("gpt", pair[1]))]
    ids = [i for ex in segments(turns) for i in encode_exchange(encode, ex)[0]]
    return ids + encode((SYSTEM + " " if not history else "") + f"USER: {message} ASSISTANT:")


def encode_exchange(
    encode: Callable[[str], list[int]], exchange: list[tuple[str, bool]]
) -> tuple[list[int], list[bool]]:
    """Tokens of one exchange and whether each counts in the loss.

    Pieces are encoded one by one: each boundary (before " reply", around end-of-text) is also a
    boundary of GPT-2's pre-tokenizer, so this equals encoding the rendered text whole.
    """
    ids: list[int] = []
    counts: list[bool] = []
    for text, counted in exchange:
        piece = [EOT_ID] if text == EOT else encode(text)
        ids += piece
        counts += [counted] * len(piece)
    return ids, counts


# ----------------------------------------------------------------------------------------------
# conversations -> rows


@dataclass
class Row:
    inputs: np.ndarray  # (seq_len,) int32
    targets: np.ndarray  # (seq_len,) int32, IGNORE where the loss does not count
    truncated: bool


def to_row(enc, turns: list[tuple[str, str]], seq_len: int) -> Row | None:
    """One fixed-length row; None when not even part of the first reply fits.

    Too long: whole leading exchanges are kept and the rest dropped; when the first exchange alone
    is too long it is cut at the end (its reply's first tokens still count).
    """
    ids: list[int] = []
    counts: list[bool] = []
    truncated = False
    for k, exchange in enumerate(segments(turns)):
        e_ids, e_counts = encode_exchange(enc.encode_ordinary, exchange)
        if len(ids) + len(e_ids) > seq_len + 1:  # seq_len inputs and their next tokens
            truncated = True
            if k == 0:
                ids, counts = e_ids[: seq_len + 1], e_counts[: seq_len + 1]
            break
        ids, counts = ids + e_ids, counts + e_counts
    targets = [t if c else IGNORE for t, c in zip(ids[1:], counts[1:], strict=True)]
    if all(t == IGNORE for t in targets):
        return None
    n = len(ids) - 1
    row_in = np.full(seq_len, EOT_ID, dtype=np.int32)
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


def prepare(records: Iterable[Any], cfg: ConversationsConfig, enc) -> Prepared:
    """Check, render, tokenize, mask and split the conversations."""
    if cfg.template not in TEMPLATES:
        raise ValueError(f"template {cfg.template!r} unknown; known: {', '.join(TEMPLATES)}")
    out = Prepared()
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
        text = path.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            try:
                data = [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: neither a JSON list nor JSON lines ({e})") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of conversations")
        return data
    from datasets import load_dataset  # the hub (or its local cache); not in the default DAG

    return load_dataset(cfg.repo, cfg.name, split=cfg.split, revision=cfg.revision)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write(prepared: Prepared, cfg: ConversationsConfig, out: Path) -> dict[str, Any]:
    """The arrays and manifest.json into `out` (written as `out.tmp`, then renamed)."""
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
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
        "tokenizer": "gpt2",
        "eot": EOT_ID,
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
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    os.replace(tmp, out)
    return manifest


def load_split(manifest_path: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of `split` from an SFT manifest; shapes and files checked."""
    manifest_path = Path(manifest_path)
    m = json.loads(manifest_path.read_text())
    if m.get("kind") != "conversations":
        raise ValueError(f"{manifest_path}: not a conversations manifest (kind {m.get('kind')!r})")
    arrays = {}
    for s in m["shards"]:
        if s["split"] == split:
            arrays[s["array"]] = np.load(manifest_path.parent / s["file"], allow_pickle=False)
    if set(arrays) != {"inputs", "targets"}:
        raise ValueError(f"{manifest_path}: no inputs/targets arrays for split {split!r}")
    x, y = arrays["inputs"], arrays["targets"]
    if x.shape != y.shape or x.ndim != 2 or x.shape[1] != m["seq_len"]:
        raise ValueError(f"{manifest_path}: {split} arrays of shapes {x.shape}, {y.shape}")
    return x, y


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config-json", required=True, help="the dataset's sft_data_params (JSON)")
    p.add_argument("--tokenizer", required=True, help="folder with GPT-2 encoder.json, vocab.bpe")
    p.add_argument("--out", required=True, type=Path, help="folder to write (arrays + manifest)")
    args = p.parse_args(argv)
    cfg = from_dict(ConversationsConfig, json.loads(args.config_json), "datasets")
    prepared = prepare(read_records(cfg), cfg, gpt2_encoding(args.tokenizer))
    m = write(prepared, cfg, args.out)
    print(
        f"{cfg.dataset}: {m['conversations']} conversations -> {m['kept']['train']} train +"
        f" {m['kept']['val']} val rows of {cfg.seq_len} tokens; skipped {m['skipped']};"
        f" truncated {m['truncated']}; loss tokens {m['target_tokens']}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
