"""The report's bytes a token on the val text (lmpipe.report.compression), for GPT-2's tokens and a
trained tokenizer's, against a count from scratch: the embedded sample's documents encoded again
and their UTF-8 bytes counted, the last one (cut by the val shard's end) decoded."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from test_tokenizer_stage import raw_manifest

from conftest import TOKENIZER_DIR
from lmpipe.config import TokenizeConfig, TokenizerConfig
from lmpipe.data.shards import read_manifest, read_shard
from lmpipe.data.tokenize import tokenize
from lmpipe.data.tokenizer import load_tokenizer
from lmpipe.paths import Layout
from lmpipe.report.compression import compression_rows, val_compression

VAL_TOKENS = 12_000
DATA = TokenizeConfig(dataset="embedded", shard_tokens=100_000, val_tokens=VAL_TOKENS)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Layout, Path]:
    """GPT-2's tokens and a 512-id trained tokenizer's of the embedded sample, in a layout."""
    from lmpipe.data.train_tokenizer import train_tokenizer

    tmp = tmp_path_factory.mktemp("compression")
    layout = Layout(str(tmp / "results"), str(tmp / "data"))
    raw = raw_manifest(tmp / "raw")
    tok = tmp / "tok"
    cfg = TokenizerConfig(name="t", dataset="embedded", vocab_size=512, max_documents=300)
    train_tokenizer(cfg, DATA, raw, tok)
    tokenize(DATA, raw, str(TOKENIZER_DIR), Path(layout.tokens_dir("embedded")), workers=1)
    tokenize(DATA, raw, str(tok), Path(layout.tokens_dir("embedded", "tok-t")), workers=1)
    return layout, tok


def from_scratch(tokenizer_dir: Path, texts: list[str], n: int) -> tuple[list[int], int]:
    """The first `n` tokens of the documents encoded again (each opened by the end of text), and
    the UTF-8 bytes they spell: a whole document's its text's, the cut one's its ids decoded."""
    tok = load_tokenizer(tokenizer_dir)
    ids: list[int] = []
    n_bytes = 0
    for text in texts:
        doc = [tok.eot_token, *tok.encode_ordinary(text)]
        if len(ids) + len(doc) <= n:
            ids += doc
            n_bytes += len(text.encode("utf-8"))
            continue
        cut = doc[1 : n - len(ids)]
        ids += doc[: n - len(ids)]
        if hasattr(tok, "decode_bytes"):  # tiktoken: the exact bytes
            n_bytes += len(tok.decode_bytes(cut))
        else:
            text = tok.tok.decode(cut, clean_up_tokenization_spaces=False)
            n_bytes += len(text.encode("utf-8"))
        break
    return ids, n_bytes


@pytest.mark.parametrize("of", [None, "tok-t"], ids=["gpt2", "trained"])
def test_bytes_a_token_is_a_count_from_scratch(data, of, fineweb_texts):
    layout, tok = data
    manifest = layout.tokens_manifest("embedded", of)
    c = val_compression(manifest)
    val = read_manifest(manifest).files("val")
    assert c.tokens == VAL_TOKENS == sum(len(read_shard(f)) for f in val)
    ids, n_bytes = from_scratch(TOKENIZER_DIR if of is None else tok, fineweb_texts, c.tokens)
    assert ids == read_shard(val[0]).tolist()  # the shard is the text encoded again
    assert c.bytes == n_bytes
    assert c.bytes_per_token == pytest.approx(n_bytes / VAL_TOKENS, rel=1e-12)
    assert c.vocab_size == (50257 if of is None else 512)


def test_the_report_has_a_row_a_tokenizer_gpt2_first(data):
    layout, _ = data
    runs = [
        SimpleNamespace(name="own", settings={"dataset": "embedded", "tokens_of": "tok-t"}),
        SimpleNamespace(name="gpt", settings={"dataset": "embedded"}),
        SimpleNamespace(name="hf-ref", settings={}),  # a reference: no data of its own
    ]
    rows = compression_rows(runs, layout)
    assert [(r["tokenizer"], r["vocab_size"], r["runs"]) for r in rows] == [
        ("GPT-2", 50257, ["gpt"]), ("tok-t", 512, ["own"]),
    ]  # fmt: skip
    gpt2, own = rows
    # a smaller vocabulary holds fewer bytes a token; GPT-2 on English web text: about 4.5
    assert 4.0 < gpt2["bytes_per_token"] < 5.0 and own["bytes_per_token"] < gpt2["bytes_per_token"]
