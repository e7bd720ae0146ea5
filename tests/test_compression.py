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


# ---- each evaluation task's text (lmpipe.eval.task_bytes, the report's second table) ----


def scratch_encoder(of: str | None, tok: Path):
    """Another implementation than the job's: Hugging Face's GPT-2 BPE from OpenAI's files (the
    job uses tiktoken's), or the trained folder's tokenizer.json read by `tokenizers` alone."""
    from tokenizers import Tokenizer
    from transformers import GPT2TokenizerFast

    if of is None:
        gpt2 = GPT2TokenizerFast(
            str(TOKENIZER_DIR / "encoder.json"), str(TOKENIZER_DIR / "vocab.bpe")
        )
        return lambda s: len(gpt2(s, add_special_tokens=False)["input_ids"])
    t = Tokenizer.from_file(str(tok / "tokenizer.json"))
    return lambda s: len(t.encode(s, add_special_tokens=False).ids)


def boolq_strings(folder: Path) -> list[str]:
    """BoolQ's text as lm-eval's super_glue/boolq/default.yaml spells it, read from its Arrow
    file with pyarrow: "{passage}\\nQuestion: {question}?\\nAnswer:", " no", " yes"."""
    import pyarrow as pa

    strings = []
    for path in sorted(folder.glob("*.arrow")):
        for row in pa.ipc.open_stream(path).read_all().to_pylist():
            strings += [f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:", " no", " yes"]
    return strings


def hellaswag_strings(path: Path) -> list[str]:
    """HellaSwag's text as llm.c's rows encode it: the context, and " " + each ending."""
    import json

    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [s for x in items for s in [x["ctx"], *(" " + e for e in x["endings"])]]


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    from lmpipe.eval.suite import data as suite_data

    out = tmp_path_factory.mktemp("suite") / "manifest.json"
    suite_data.prepare(out, ["boolq"])
    return out


@pytest.mark.parametrize("of", [None, "tok-t"], ids=["gpt2", "trained"])
def test_task_bytes_is_a_count_from_scratch(data, suite, of, tmp_path):
    import json

    from conftest import RESOURCES
    from lmpipe.eval.task_bytes import main

    layout, tok = data
    folder = TOKENIZER_DIR if of is None else tok
    hellaswag = RESOURCES / "hellaswag_val_sample.jsonl"
    main(["--tokenizer", str(folder), "--suite", str(suite), "--out", str(tmp_path / "s.json")])
    main(
        [
            "--tokenizer",
            str(folder),
            "--hellaswag",
            str(hellaswag),
            "--out",
            str(tmp_path / "h.json"),
        ]
    )
    counts = json.loads((tmp_path / "s.json").read_text())["tasks"]
    counts |= json.loads((tmp_path / "h.json").read_text())["tasks"]
    assert set(counts) == {"boolq", "hellaswag"}
    encode = scratch_encoder(of, tok)
    texts = {
        "boolq": boolq_strings(suite.parent / "boolq"),
        "hellaswag": hellaswag_strings(hellaswag),
    }
    for task, strings in texts.items():
        want = {
            "items": 3270 if task == "boolq" else len(strings) // 5,
            "strings": len(strings),
            "tokens": sum(encode(s) for s in strings),
            "bytes": sum(len(s.encode("utf-8")) for s in strings),
        }
        assert counts[task] == want, task


def test_the_report_shows_each_task_beside_the_val_text(data, suite, tmp_path):
    """A row a tokenizer, GPT-2's first: its val text's and each task's bytes a token, read from
    the task_bytes files the report's runs' evaluations name."""
    from lmpipe.eval.task_bytes import main
    from lmpipe.report.compression import task_compression

    layout, tok = data
    hellaswag = str(Path(__file__).parents[1] / "resources/hellaswag_val_sample.jsonl")
    for of, folder in [(None, TOKENIZER_DIR), ("tok-t", tok)]:
        for text, flag, src in [
            ("suite", "--suite", str(suite)),
            ("hellaswag-embedded", "--hellaswag", hellaswag),
        ]:
            main(["--tokenizer", str(folder), flag, src, "--out", layout.task_bytes(text, of)])
    texts = ["suite", "hellaswag-embedded"]
    runs = [
        SimpleNamespace(
            name=name, settings={"dataset": "embedded", "tokens_of": of, "task_texts": texts}
        )
        for name, of in [("own", "tok-t"), ("gpt", None)]
    ]
    table = task_compression(runs, layout, compression_rows(runs, layout))
    assert table["columns"] == ["val: embedded", "hellaswag", "boolq"]
    assert [r["tokenizer"] for r in table["rows"]] == ["GPT-2", "tok-t"]
    gpt2, own = (r["cells"] for r in table["rows"])
    assert (
        gpt2["val: embedded"] == val_compression(layout.tokens_manifest("embedded")).bytes_per_token
    )
    # GPT-2 on English: about 4.5 bytes a token; 512 ids learnt on 300 documents hold fewer
    for task in ("boolq", "hellaswag"):
        assert 4.0 < gpt2[task] < 5.0 and own[task] < gpt2[task], task
