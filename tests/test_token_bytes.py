"""Each token id's UTF-8 bytes (lmpipe.data.token_bytes): summed over real text's tokens, the
text's own byte count, for GPT-2's tokenizer and a Hugging Face byte-level BPE; saved beside the
shards and named in the tokens manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hf_models import bpe_tokenizer

from conftest import RESOURCES, TOKENIZER_DIR
from lmpipe.config import SourceConfig, TokenizeConfig
from lmpipe.data import token_bytes
from lmpipe.data.download import download_dataset
from lmpipe.data.shards import read_manifest
from lmpipe.data.tokenize import tokenize
from lmpipe.data.tokenizer import EOT_ID, HFTokenizer, gpt2_encoding


@pytest.fixture(scope="module")
def raw_sample(tmp_path_factory):
    out = tmp_path_factory.mktemp("raw")
    download_dataset(
        SourceConfig(source="local", path=str(RESOURCES / "fineweb_sample.parquet")), out
    )
    return out


def _texts(fineweb_texts: list[str]) -> list[str]:
    # real web text (some of it beyond ASCII) and the awkward cases of byte-level BPE
    return fineweb_texts[:300] + ["héllo wörld — ünïcødé 日本語 🙂", "  \n\n\t tabs  ", "x"]


def test_gpt2_table_sums_to_the_texts_bytes(fineweb_texts):
    enc = gpt2_encoding(TOKENIZER_DIR)
    table, how = token_bytes.token_bytes(enc)
    assert how == "tiktoken" and len(table) == 50257
    assert table[EOT_ID] == 0  # a special token spells no text
    assert any(not t.isascii() for t in fineweb_texts[:300])
    for text in _texts(fineweb_texts):
        assert table[enc.encode_ordinary(text)].sum() == len(text.encode("utf-8")), text[:60]


def test_hf_byte_level_table_sums_to_the_texts_bytes(fineweb_texts):
    tok = HFTokenizer(bpe_tokenizer(), "hf test")
    table, how = token_bytes.token_bytes(tok)
    assert how == "byte-level" and len(table) == tok.n_vocab
    for special in ("<pad>", "<s>", "</s>"):
        assert table[tok.tok.convert_tokens_to_ids(special)] == 0
    for text in _texts(fineweb_texts):
        assert table[tok.encode_ordinary(text)].sum() == len(text.encode("utf-8")), text[:60]


def test_sentencepiece_pieces():
    """`▁` is one space byte, `<0xNN>` one byte, the rest its UTF-8."""
    assert token_bytes.piece_bytes("▁the", "metaspace") == 4
    assert token_bytes.piece_bytes("<0x0A>", "metaspace") == 1
    assert token_bytes.piece_bytes("é", "metaspace") == 2
    assert token_bytes.piece_bytes("Ġthe", "byte-level") == 4  # Ġ is the space byte
    assert token_bytes.piece_bytes("the", "decode") is None


@pytest.mark.parametrize("table", [True, False])
def test_tokenize_writes_the_table_and_the_manifest_names_it(raw_sample, tmp_path, table):
    raw_dir = raw_sample
    cfg = TokenizeConfig(dataset="sample", shard_tokens=200_000, val_tokens=50_000)
    out = tmp_path / "tokens"
    m = tokenize(cfg, raw_dir / "manifest.json", str(TOKENIZER_DIR), out, workers=2)
    assert m["token_bytes"] == {"file": "token_bytes.npy", "how": "tiktoken"}
    expected, _ = token_bytes.token_bytes(gpt2_encoding(TOKENIZER_DIR))
    if not table:  # data tokenized before the table: no table, no error
        del m["token_bytes"]
        (out / "manifest.json").write_text(json.dumps(m))
        assert read_manifest(out / "manifest.json").byte_table() is None
        return
    np.testing.assert_array_equal(read_manifest(out / "manifest.json").byte_table(), expected)
