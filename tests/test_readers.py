"""The readers' error paths: each broken input is an error that names the file (and the line or
field where there is one), never a bare KeyError, JSONDecodeError or UnicodeDecodeError.

Token shards through the loader the trainer uses (tests/test_data.py checks read_shard itself),
the tokens manifest, the fine-tuning conversations and their prepared arrays, HellaSwag's jsonl
and llm.c's checkpoint."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from lmpipe.chat.data import read_records
from lmpipe.chat.loader import load_split
from lmpipe.chat.loader import read_manifest as read_conversations_manifest
from lmpipe.config import ConversationsConfig
from lmpipe.data.loader import DataShare, ShardLoader, shard_files, val_batches
from lmpipe.data.shards import ShardError, read_manifest, write_shard
from lmpipe.eval.hellaswag import HellaSwagError, load_items
from lmpipe.models.gpt2.llmc import read_llmc, write_llmc
from lmpipe.models.gpt2.model import GPT, GPTConfig


def raises(exc: type[Exception], *parts: str):
    """pytest.raises matching every part, literally, in order."""
    return pytest.raises(exc, match=".*".join(re.escape(p) for p in parts))


# ---- token shards and their manifest -------------------------------------------------------------


@pytest.fixture
def tokens(tmp_path) -> Path:
    """A manifest of a val shard and two train shards of 300 tokens each."""
    shards = []
    for i, split in enumerate(["val", "train", "train"]):
        name = f"t_{split}_{i:06d}.bin"
        write_shard(tmp_path / name, np.arange(300, dtype=np.uint16))
        shards.append({"file": name, "split": split, "tokens": 300})
    (tmp_path / "manifest.json").write_text(json.dumps({"dataset": "t", "shards": shards}))
    return tmp_path / "manifest.json"


def header_int(path: Path, index: int, value: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[4 * index : 4 * index + 4] = struct.pack("<i", value)
    path.write_bytes(bytes(raw))


BROKEN_SHARDS = {
    "missing": (lambda p: p.unlink(), "shard file not found"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-3]), "truncated or corrupt"),
    "a_token_more": (lambda p: p.write_bytes(p.read_bytes() + bytes(2)), "truncated or corrupt"),
    "header_only": (lambda p: p.write_bytes(p.read_bytes()[:100]), "shorter than the 1024-byte"),
    "bad_magic": (lambda p: header_int(p, 0, 1234), "bad magic 1234"),
    "bad_version": (lambda p: header_int(p, 1, 7), "unsupported version 7"),
}


@pytest.mark.parametrize("break_it, says", BROKEN_SHARDS.values(), ids=BROKEN_SHARDS.keys())
def test_a_broken_shard_is_named_when_the_loader_reaches_it(tokens, break_it, says):
    """The second train shard broken: the loader's move to it names that file."""
    files = shard_files(tokens, "train")
    loader = ShardLoader(files, micro_batch=2, seq_len=16, batch_tokens=64, dp=DataShare(0, 1))
    break_it(files[1])
    with raises(ShardError, str(files[1]), says):
        for _ in range(8):  # 300 tokens: 4 steps of 64 (+1), then the next shard
            loader.next_batch()


@pytest.mark.parametrize("break_it, says", BROKEN_SHARDS.values(), ids=BROKEN_SHARDS.keys())
def test_a_broken_val_shard_is_named(tokens, break_it, says):
    """The validation batches' shard broken: named."""
    (val,) = shard_files(tokens, "val")
    break_it(val)
    with raises(ShardError, str(val), says):
        val_batches(val, micro_batch=2, seq_len=16, val_tokens=64, dp=DataShare(0, 1), eot=50256)


def test_a_shard_shorter_than_a_step_is_named(tokens):
    """A train shard that cannot fill one step: the file and train.batch_tokens are named."""
    files = shard_files(tokens, "train")
    with raises(ValueError, str(files[0]), "300 tokens, fewer than one step", "batch_tokens 512"):
        ShardLoader(files, micro_batch=2, seq_len=16, batch_tokens=512, dp=DataShare(0, 8))


MANIFESTS = {
    "not_json": ('{"shards": [', ["not valid JSON"]),
    "no_shards": ('{"dataset": "t"}', ["not a tokens manifest", "KeyError: 'shards'"]),
    "no_split": ('{"shards": [{"file": "a.bin"}]}', ["not a tokens manifest", "KeyError: 'split'"]),
    "not_a_mapping": ("[1, 2]", ["not a tokens manifest", "a JSON list"]),
    "no_train": ('{"shards": [{"file": "a.bin", "split": "val"}]}', ["no 'train' shards listed"]),
}


@pytest.mark.parametrize("text, says", MANIFESTS.values(), ids=MANIFESTS.keys())
def test_a_malformed_tokens_manifest_is_named(tmp_path, text, says):
    """A manifest.json that is not JSON, or lists no shards as the loader needs them: named."""
    path = tmp_path / "manifest.json"
    path.write_text(text)
    with raises(ValueError, str(path), *says):
        shard_files(path, "train")


def test_a_missing_tokens_manifest_is_named(tmp_path):
    """No manifest.json: the path is in the error."""
    with raises(FileNotFoundError, str(tmp_path / "manifest.json"), "tokens manifest not found"):
        shard_files(tmp_path / "manifest.json", "train")


def test_the_one_tokens_manifest_reader(tokens):
    """What the loaders, the val loss and the settings hash read: the shards in order, with
    their split, tokens and sha256 (a shard without one is named by its file)."""
    m = json.loads(tokens.read_text())
    m["shards"][0]["sha256"] = "ab" * 32
    tokens.write_text(json.dumps(m))
    manifest = read_manifest(tokens)
    assert [(s.file.name, s.split, s.tokens) for s in manifest.shards] == [
        ("t_val_000000.bin", "val", 300),
        ("t_train_000001.bin", "train", 300),
        ("t_train_000002.bin", "train", 300),
    ]
    assert manifest.files("val") == [tokens.parent / "t_val_000000.bin"]
    assert manifest.identity() == ["ab" * 32, "t_train_000001.bin", "t_train_000002.bin"]


@pytest.mark.parametrize("text, says", MANIFESTS.values(), ids=MANIFESTS.keys())
def test_the_tokens_manifest_reader_names_a_malformed_file(tmp_path, text, says):
    path = tmp_path / "manifest.json"
    path.write_text(text)
    with raises(ValueError, str(path), *says):
        read_manifest(path).files("train")


# ---- fine-tuning: the conversations file --------------------------------------------------------


def conversations(path: Path) -> list:
    cfg = ConversationsConfig(dataset="chat", source="local", seq_len=64, path=str(path))
    return list(read_records(cfg))


GOOD = '{"id": "a", "conversations": [{"from": "human", "value": "Hi"}]}'
CONVERSATION_FILES = {
    "jsonl_bad_line_3": (
        f'{GOOD}\n{GOOD}\n{{"id": oops}}\n',
        "neither a JSON list (line 2: Extra data) nor JSON lines (line 3: Expecting value)",
    ),
    "json_list_bad_line_3": (
        f'[\n{GOOD},\n{{"id": oops}}\n]\n',
        "neither a JSON list (line 3: Expecting value) nor JSON lines (line 1: ",
    ),
    "an_object": (GOOD, "expected a JSON list of conversations"),
}


@pytest.mark.parametrize("text, says", CONVERSATION_FILES.values(), ids=CONVERSATION_FILES.keys())
def test_a_malformed_conversations_file_names_file_and_line(tmp_path, text, says):
    """Neither a JSON list nor JSON lines: the file, and where each reading failed."""
    path = tmp_path / "chat.json"
    path.write_text(text)
    with raises(ValueError, f"{path}: {says}"):
        conversations(path)


def test_a_conversations_file_that_is_not_utf8_is_named(tmp_path):
    """A conversations file in another encoding: the file and the byte, not a bare decode error."""
    path = tmp_path / "chat.json"
    path.write_bytes(b'[{"id": "caf\xe9"}]')  # Latin-1, not UTF-8
    with raises(ValueError, f"{path}: not UTF-8 text", "at byte 12"):
        conversations(path)


def test_a_missing_conversations_file_names_the_setting(tmp_path):
    """A conversations path that does not exist: the setting and the path are named."""
    with raises(FileNotFoundError, "datasets.chat.path:", str(tmp_path / "nope.json")):
        conversations(tmp_path / "nope.json")


# ---- fine-tuning: the prepared rows (lmpipe.chat.data's output) ---------------------------------


@pytest.fixture
def sft(tmp_path) -> Path:
    """A conversations manifest and its train arrays: 4 rows of 8 tokens."""
    shards = []
    for kind in ("inputs", "targets"):
        np.save(tmp_path / f"train_{kind}.npy", np.zeros((4, 8), np.int32), allow_pickle=False)
        shards.append({"file": f"train_{kind}.npy", "split": "train", "array": kind, "rows": 4})
    manifest = {"kind": "conversations", "seq_len": 8, "shards": shards}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path / "manifest.json"


def test_prepared_rows_read_back(sft):
    """The starting point of the cases below reads."""
    x, y = load_split(sft, "train")
    assert x.shape == y.shape == (4, 8)


def edit_manifest(sft: Path, change) -> None:
    m = json.loads(sft.read_text())
    change(m)
    sft.write_text(json.dumps(m))


BROKEN_SFT = {
    "manifest_not_json": (lambda d: (d / "manifest.json").write_text("{"), "manifest.json", "JSON"),
    "manifest_of_tokens": (
        lambda d: edit_manifest(d / "manifest.json", lambda m: m.pop("kind")),
        "manifest.json",
        "not a conversations manifest (kind None)",
    ),
    "no_targets_listed": (
        lambda d: edit_manifest(d / "manifest.json", lambda m: m["shards"].pop()),
        "manifest.json",
        "no inputs/targets arrays for split 'train'",
    ),
    "array_truncated": (
        lambda d: (d / "train_targets.npy").write_bytes(
            (d / "train_targets.npy").read_bytes()[:60]
        ),
        "train_targets.npy",
        "not a readable .npy array",
    ),
    "array_not_npy": (
        lambda d: (d / "train_inputs.npy").write_bytes(b"garbage" * 20),
        "train_inputs.npy",
        "not a readable .npy array",
    ),
    "other_row_length": (
        lambda d: edit_manifest(d / "manifest.json", lambda m: m.update(seq_len=16)),
        "manifest.json",
        "train arrays of shapes (4, 8), (4, 8)",
    ),
}


@pytest.mark.parametrize("break_it, file, says", BROKEN_SFT.values(), ids=BROKEN_SFT.keys())
def test_broken_prepared_rows_are_named(sft, break_it, file, says):
    """A broken conversations manifest or array: the file at fault is named."""
    break_it(sft.parent)
    with raises(ValueError, f"{sft.parent / file}: ", says):
        load_split(sft, "train")


def test_the_one_conversations_manifest_reader(sft):
    """What fine-tuning and the held-out loss read: the arrays, the row length, the counts."""
    edit_manifest(sft, lambda m: m.update(kept={"train": 4, "val": 0}))
    m = read_conversations_manifest(sft)
    assert m.seq_len == 8 and m.rows("train") == 4
    assert [(a.file, a.array) for a in m.arrays] == [
        (sft.parent / "train_inputs.npy", "inputs"),
        (sft.parent / "train_targets.npy", "targets"),
    ]
    assert m.identity() == ["train_inputs.npy", "train_targets.npy"]


BROKEN_CONVERSATIONS_MANIFEST = {
    "no_seq_len": (lambda m: m.pop("seq_len"), "KeyError: 'seq_len'"),
    "no_array": (lambda m: m["shards"][0].pop("array"), "KeyError: 'array'"),
    "shards_not_a_list": (lambda m: m.update(shards=3), "TypeError"),
}


@pytest.mark.parametrize(
    "change, says", BROKEN_CONVERSATIONS_MANIFEST.values(), ids=BROKEN_CONVERSATIONS_MANIFEST.keys()
)
def test_the_conversations_manifest_reader_names_a_malformed_file(sft, change, says):
    edit_manifest(sft, change)
    with raises(ValueError, f"{sft}: not a conversations manifest", says):
        read_conversations_manifest(sft)


def test_a_missing_conversations_manifest_and_count_are_named(sft, tmp_path):
    with raises(FileNotFoundError, str(tmp_path / "nope.json"), "conversations manifest"):
        read_conversations_manifest(tmp_path / "nope.json")
    with raises(ValueError, str(sft), "no `kept` count of split 'train'"):
        read_conversations_manifest(sft).rows("train")


def test_a_missing_array_is_named(sft):
    """An array the manifest lists but the folder lacks: its path is in the error."""
    (sft.parent / "train_targets.npy").unlink()
    with raises(FileNotFoundError, str(sft.parent / "train_targets.npy")):
        load_split(sft, "train")


# ---- HellaSwag ----------------------------------------------------------------------------------

ITEM = {
    "activity_label": "Cooking",
    "ctx_a": "A man cracks an egg.",
    "ctx_b": "he",
    "ctx": "A man cracks an egg. he",
    "endings": ["fries it.", "eats the shell.", "sings.", "leaves."],
    "label": 0,
}
HELLASWAG_FILES = {
    # (the file's bytes, what the error says; tests/test_evaluate.py has bad JSON, endings, label)
    "not_an_object": (b"[1, 2]\n", ":1: expected a JSON object, got list"),
    "field_missing": (
        json.dumps(ITEM).encode() + b"\n" + json.dumps(ITEM | {"ctx": None}).encode(),
        ":2: field 'ctx' missing or not a str",
    ),
    "cut_in_a_character": (
        json.dumps(ITEM).encode() + b"\n" + '{"ctx": "caf\u00e9'.encode()[:-1],
        ":2: not UTF-8",
    ),
    "no_items": (b"\n\n", ": no items"),
}


@pytest.mark.parametrize("data, says", HELLASWAG_FILES.values(), ids=HELLASWAG_FILES.keys())
def test_a_malformed_hellaswag_file_names_file_and_line(tmp_path, data, says):
    """HellaSwagError naming the file, the line and the field at fault."""
    path = tmp_path / "hellaswag.jsonl"
    path.write_bytes(data)
    with raises(HellaSwagError, f"{path}{says}"):
        load_items(path)


def test_a_missing_hellaswag_file_is_named(tmp_path):
    """No HellaSwag file: a HellaSwagError naming it."""
    with raises(HellaSwagError, f"{tmp_path / 'val.jsonl'}: HellaSwag file not found"):
        load_items(tmp_path / "val.jsonl")


# ---- llm.c's checkpoint -------------------------------------------------------------------------


@pytest.fixture
def llmc_bin(tmp_path) -> Path:
    """A tiny GPT-2 as llm.c's fp32 .bin: the 1024-byte header, then its parameters."""
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=100,
                    padded_vocab_size=128)  # fmt: skip
    path = tmp_path / "model.bin"
    write_llmc(GPT(cfg), path)
    return path


BROKEN_LLMC = {
    "bad_magic": (lambda p: header_int(p, 0, 20240520), "bad magic 20240520 (expected 20240326)"),
    "bf16_version": (lambda p: header_int(p, 1, 5), "version 5; only fp32 (version 3) is read"),
    "header_cut": (lambda p: p.write_bytes(p.read_bytes()[:512]), "512 bytes, shorter than"),
    "a_float_more": (lambda p: p.write_bytes(p.read_bytes() + bytes(4)), "but the header implies"),
    "other_shape": (lambda p: header_int(p, 4, 2), "but the header implies"),  # 2 layers
}


@pytest.mark.parametrize("break_it, says", BROKEN_LLMC.values(), ids=BROKEN_LLMC.keys())
def test_a_broken_llmc_checkpoint_is_named(llmc_bin, break_it, says):
    """A .bin that is not llm.c's fp32 GPT-2 of its header's shape: the file and why."""
    read_llmc(llmc_bin)  # whole, it reads
    break_it(llmc_bin)
    with raises(ValueError, f"{llmc_bin}: ", says):
        read_llmc(llmc_bin)


def test_a_missing_llmc_checkpoint_is_named(tmp_path):
    """No .bin: the path is in the error."""
    with raises(FileNotFoundError, str(tmp_path / "model.bin")):
        read_llmc(tmp_path / "model.bin")
