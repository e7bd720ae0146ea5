"""Bits per byte, end to end: the val_loss evaluation's result file and the validation lines of
training carry the UTF-8 bytes of the text they scored, counted independently here from the
raw documents (and the scored part of the last one, decoded), and bits per byte recomputed from
the file; for GPT-2's tokens and for an `arch: hf` model's own."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_models import make_model
from test_train import config, metrics, run

from conftest import RESOURCES, TOKENIZER_DIR
from lmpipe.config import SourceConfig, TokenizeConfig, canonical_json
from lmpipe.data.download import download_dataset
from lmpipe.data.shards import read_manifest, read_shard
from lmpipe.data.tokenize import tokenize
from lmpipe.data.tokenizer import load_tokenizer
from lmpipe.models.gpt2.hf import write_hf
from lmpipe.models.gpt2.model import GPT, GPTConfig

VAL_TOKENS = 12_000


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("raw")
    download_dataset(
        SourceConfig(source="local", path=str(RESOURCES / "fineweb_sample.parquet")), out
    )
    return out / "manifest.json"


def tokens_of(raw: Path, tokenizer: Path, out: Path) -> Path:
    cfg = TokenizeConfig(dataset="sample", shard_tokens=100_000, val_tokens=VAL_TOKENS)
    tokenize(cfg, raw, str(tokenizer), out, workers=1)
    return out / "manifest.json"


def decoded_bytes(tokenizer_dir: Path, ids: list[int]) -> int:
    """The UTF-8 bytes of `ids` decoded by the tokenizer itself (special tokens skipped)."""
    tok = load_tokenizer(tokenizer_dir)
    if hasattr(tok, "decode_bytes"):  # tiktoken: the exact bytes
        return len(tok.decode_bytes([i for i in ids if i != tok.eot_token]))
    text = tok.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return len(text.encode("utf-8"))


def check_bytes(result: dict, shard: Path, eot: int, tokenizer_dir: Path, texts: list[str]):
    """`bytes`: each whole document scored is its raw text's UTF-8; the last, cut short, is what
    its scored targets decode to. `bits_per_byte`: loss * tokens / (bytes * ln 2)."""
    n = result["tokens"]
    targets = np.asarray(read_shard(shard)[1 : n + 1], dtype=np.int64)
    assert read_shard(shard)[0] == eot  # the first target opens document 0
    whole = len(result["doc_bytes"]) - 1
    assert result["doc_bytes"][:whole] == [len(t.encode("utf-8")) for t in texts[:whole]]
    starts = [0, *(np.flatnonzero(targets == eot) + 1)]  # each document's first target
    assert whole > 0 and len(starts) == whole + 1
    last = starts[whole]
    assert result["doc_bytes"][-1] == decoded_bytes(tokenizer_dir, targets[last:].tolist())
    assert result["bytes"] == sum(result["doc_bytes"])
    assert result["bytes"] == decoded_bytes(tokenizer_dir, targets.tolist())
    expected = result["value"] * n / (result["bytes"] * math.log(2))
    assert result["bits_per_byte"] == pytest.approx(expected, rel=1e-12)


def evaluate_cli(model_dir: Path, manifest: Path, out: Path, tokens: int) -> dict:
    cfg = canonical_json({"run": "t", "evaluation": "val_loss",
                          "settings": {"tokens": tokens, "batch": 4}})  # fmt: skip
    cmd = [sys.executable, "-m", "lmpipe.eval", "val_loss", "--config-json", cfg]
    subprocess.run([*cmd, "--model", str(model_dir), "--tokens", str(manifest), "--out", str(out)],
                   check=True)  # fmt: skip
    return json.loads(out.read_text())


def test_a_gpt2_val_loss_file_carries_its_bytes_and_bits_per_byte(raw, tmp_path, fineweb_texts):
    torch.manual_seed(0)
    model = tmp_path / "hf"
    write_hf(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=128)), TOKENIZER_DIR,
             model, {"run": "t", "step": 0})  # fmt: skip
    manifest = tokens_of(raw, TOKENIZER_DIR, tmp_path / "tokens")
    result = evaluate_cli(model, manifest, tmp_path / "val_loss.json", 3072)
    assert result["tokens"] == 3072 and "tokens_of" not in result
    shard = read_manifest(manifest).files("val")[0]
    check_bytes(result, shard, 50256, TOKENIZER_DIR, fineweb_texts)
    # a token spells several bytes: fewer bits a byte than a token
    assert 2 < result["bits_per_byte"] < result["value"] / math.log(2)


def test_a_llama_val_loss_file_in_its_own_tokens(raw, tmp_path, fineweb_texts):
    model = make_model("llama", tmp_path / "llama")
    manifest = tokens_of(raw, model, tmp_path / "tokens-llama")
    assert json.loads(manifest.read_text())["token_bytes"]["how"] == "byte-level"
    result = evaluate_cli(model, manifest, tmp_path / "val_loss.json", 10_240)
    m = read_manifest(manifest)
    check_bytes(result, m.files("val")[0], m.eot, model, fineweb_texts)


def test_data_tokenized_before_the_table_scores_without_bytes(raw, tmp_path):
    torch.manual_seed(0)
    model = tmp_path / "hf"
    write_hf(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=128)), TOKENIZER_DIR,
             model, {"run": "t", "step": 0})  # fmt: skip
    manifest = tokens_of(raw, TOKENIZER_DIR, tmp_path / "tokens")
    old = json.loads(manifest.read_text())
    del old["token_bytes"]
    manifest.write_text(json.dumps(old))
    result = evaluate_cli(model, manifest, tmp_path / "val_loss.json", 1024)
    assert result["bytes"] is None and result["bits_per_byte"] is None
    assert "doc_bytes" not in result and result["value"] > 0


def test_validation_during_training_records_bytes_and_bits_per_byte(raw, tmp_path):
    """Each validation line of metrics.jsonl: the bytes of the val text scored (the targets of
    the first val_tokens, decoded) and bits per byte from its own loss; none without a table."""
    manifest = tokens_of(raw, TOKENIZER_DIR, tmp_path / "tokens")
    cfg = config(1, max_steps=2, val_every=2, checkpoint_every=0)
    run(cfg, manifest, tmp_path / "run")
    val = [m for m in metrics(tmp_path / "run") if "val_loss" in m]
    assert [m["step"] for m in val] == [0, 2]
    n = cfg["train"]["val_tokens"]  # 1,024: whole batches of 4 x 32
    targets = read_shard(read_manifest(manifest).files("val")[0])[1 : n + 1].tolist()
    for m in val:
        assert m["val_bytes"] == decoded_bytes(TOKENIZER_DIR, targets)
        assert sum(m["val_documents"]["bytes"]) == m["val_bytes"]
        assert m["val_bpb"] == pytest.approx(m["val_loss"] * n / (m["val_bytes"] * math.log(2)))
    old = json.loads(manifest.read_text())
    del old["token_bytes"]
    manifest.write_text(json.dumps(old))
    shutil.rmtree(tmp_path / "run")
    run(cfg, manifest, tmp_path / "run")
    val = [m for m in metrics(tmp_path / "run") if "val_loss" in m]
    assert val and not any("val_bpb" in m or "val_bytes" in m for m in val)


def test_a_mixtures_bits_per_byte_is_its_sources_weighted_by_the_mixture(raw, tmp_path):
    """Each source scored with its own byte table; the mixture's figure is their mean by
    weight, as its loss is; a source without a table leaves the mixture's None."""
    from lmpipe.data.mixture import write_mixture
    from lmpipe.eval.val_loss import evaluate
    from lmpipe.registry import ValLossSettings

    torch.manual_seed(0)
    model = tmp_path / "hf"
    write_hf(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=128)), TOKENIZER_DIR,
             model, {"run": "t", "step": 0})  # fmt: skip
    sources = {n: tokens_of(raw, TOKENIZER_DIR, tmp_path / n / "tokens") for n in ("a", "b")}
    mix = tmp_path / "mix" / "tokens" / "manifest.json"
    mix.parent.mkdir(parents=True)
    write_mixture(mix, "mix", {"a": 3, "b": 1}, sources)
    settings = ValLossSettings(tokens=1024, batch=4)
    result = evaluate(settings, model, {"tokens": mix}, "cpu")
    a, b = result["sources"]["a"], result["sources"]["b"]
    for s in (a, b):
        assert s["bits_per_byte"] == pytest.approx(
            s["value"] * s["tokens"] / (s["bytes"] * math.log(2))
        )
    assert result["bits_per_byte"] == pytest.approx(
        0.75 * a["bits_per_byte"] + 0.25 * b["bits_per_byte"]
    )
    assert result["bytes"] == a["bytes"] + b["bytes"]
    old = json.loads(sources["b"].read_text())
    del old["token_bytes"]
    sources["b"].write_text(json.dumps(old))
    result = evaluate(settings, model, {"tokens": mix}, "cpu")
    assert result["sources"]["a"]["bits_per_byte"] is not None
    assert result["sources"]["b"]["bits_per_byte"] is None
    assert result["bits_per_byte"] is None and result["bytes"] is None
