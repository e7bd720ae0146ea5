"""The data stages: tokenizer, shard format, download and tokenize."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken

from conftest import RESOURCES, TOKENIZER_DIR
from lmpipe.config import SourceConfig, TokenizeConfig
from lmpipe.data import shards
from lmpipe.data.download import download_dataset
from lmpipe.data.tokenize import tokenize
from lmpipe.data.tokenizer import EOT_ID, gpt2_encoding

# tiktoken caches its downloads under sha1(url); these are the names of OpenAI's files.
TIKTOKEN_CACHE_NAMES = {
    "6d1cbeee0f20b3d9449abfede4726ed8212e3aee": "vocab.bpe",
    "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6": "encoder.json",
}


@pytest.fixture(scope="module")
def tiktoken_gpt2(tmp_path_factory):
    """tiktoken's own `gpt2` encoding, offline: its cache is filled with the same OpenAI files."""
    import os

    cache = tmp_path_factory.mktemp("tiktoken_cache")
    for sha1, name in TIKTOKEN_CACHE_NAMES.items():
        shutil.copy(TOKENIZER_DIR / name, cache / sha1)
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    try:
        yield tiktoken.get_encoding("gpt2")
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR")
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


# ---- tokenizer ---------------------------------------------------------------------------------


def test_tokenizer_equals_tiktoken_gpt2_on_real_text(tiktoken_gpt2, fineweb_texts):
    ours = gpt2_encoding(TOKENIZER_DIR)
    shakespeare = (RESOURCES / "tinyshakespeare_20k.txt").read_text()
    texts = fineweb_texts[:200] + [shakespeare, "Hello world", "  leading spaces\n\n\ttabs 123"]
    for text in texts:
        assert ours.encode_ordinary(text) == tiktoken_gpt2.encode_ordinary(text)
    assert ours.encode("Hello world") == [15496, 995]
    assert ours.n_vocab == tiktoken_gpt2.n_vocab == 50257


def test_tokenizer_special_tokens_match_tiktoken(tiktoken_gpt2):
    ours = gpt2_encoding(TOKENIZER_DIR)
    text = "end of one<|endoftext|>start of the next"
    assert ours.encode(text, allowed_special="all") == tiktoken_gpt2.encode(
        text, allowed_special="all"
    )
    assert ours.encode("<|endoftext|>", allowed_special="all") == [EOT_ID]
    # as ordinary text (how documents are encoded) it is not the special token
    assert ours.encode_ordinary(text) == tiktoken_gpt2.encode_ordinary(text)
    assert EOT_ID not in ours.encode_ordinary(text)
    with pytest.raises(ValueError, match="disallowed special token"):
        ours.encode(text)


def test_tokenizer_missing_file_is_named(tmp_path):
    shutil.copy(TOKENIZER_DIR / "encoder.json", tmp_path / "encoder.json")
    with pytest.raises(FileNotFoundError, match="vocab.bpe"):
        gpt2_encoding(tmp_path)


# ---- shard format ------------------------------------------------------------------------------


def test_shard_round_trip_with_exact_header_bytes(tmp_path):
    tokens = np.array([EOT_ID, 15496, 995, 0, 65535], dtype=np.uint16)
    path = tmp_path / "s.bin"
    shards.write_shard(path, tokens)
    raw = path.read_bytes()
    # 256 little-endian int32: magic, version, count, then zeros; then uint16 tokens
    assert raw[:12] == struct.pack("<3i", 20240520, 1, 5)
    assert raw[12:1024] == bytes(1012)
    assert raw[1024:] == struct.pack("<5H", *tokens.tolist())
    assert len(raw) == 1024 + 2 * 5
    np.testing.assert_array_equal(shards.read_shard(path), tokens)
    np.testing.assert_array_equal(shards.read_shard(path, mmap=False), tokens)


def test_shard_refuses_ids_beyond_uint16(tmp_path):
    with pytest.raises(ValueError, match="uint16"):
        shards.write_shard(tmp_path / "s.bin", np.array([70000]))
    assert not (tmp_path / "s.bin").exists()


@pytest.fixture
def good_shard(tmp_path):
    path = tmp_path / "good_train_000001.bin"
    shards.write_shard(path, np.arange(100, dtype=np.uint16))
    return path


def test_truncated_shard_names_the_file(good_shard):
    good_shard.write_bytes(good_shard.read_bytes()[:-2])
    with pytest.raises(shards.ShardError, match=f"{good_shard}.*truncated"):
        shards.read_shard(good_shard)


def test_short_file_names_the_file(good_shard):
    good_shard.write_bytes(b"\0" * 100)
    with pytest.raises(shards.ShardError, match=f"{good_shard}.*shorter than"):
        shards.read_header(good_shard)


def test_wrong_magic_names_the_file(good_shard):
    raw = bytearray(good_shard.read_bytes())
    raw[:4] = struct.pack("<i", 20240326)  # llm.c's *model* magic, not a shard's
    good_shard.write_bytes(bytes(raw))
    with pytest.raises(shards.ShardError, match=f"{good_shard}.*bad magic 20240326"):
        shards.read_shard(good_shard)


def test_wrong_version_names_the_file(good_shard):
    raw = bytearray(good_shard.read_bytes())
    raw[4:8] = struct.pack("<i", 2)
    good_shard.write_bytes(bytes(raw))
    with pytest.raises(shards.ShardError, match=f"{good_shard}.*version 2"):
        shards.read_shard(good_shard)


def test_missing_shard_names_the_file(tmp_path):
    with pytest.raises(shards.ShardError, match="nope.bin.*not found"):
        shards.read_header(tmp_path / "nope.bin")


# ---- the training loader ----------------------------------------------------------------------


def test_shard_loader_inputs_and_next_token_targets_are_the_shards_slices(tmp_path):
    """Each micro-batch of each rank is x = tokens[p:p+B*T], y = tokens[p+1:p+B*T+1] of the
    shard's tokens (read here with np.fromfile after the 1024-byte header): step s covers
    batch_tokens consecutive tokens, micro-batch i of rank r slice i*W + r of them; a step that
    would run past a shard's end starts the next shard, and the last wraps to the first."""
    from lmpipe.data.loader import DataShare, ShardLoader, val_batches

    rng = np.random.default_rng(0)
    files = [tmp_path / "t_train_000001.bin", tmp_path / "t_train_000002.bin"]
    # 3 steps of 64 + 1 fit the first shard exactly; the second is 1 token short of a 3rd step
    for path, n in zip(files, (3 * 64 + 1, 3 * 64), strict=True):
        shards.write_shard(path, rng.integers(0, 50257, n))
    tokens = [np.fromfile(f, dtype="<u2", offset=1024).astype(np.int64) for f in files]
    B, T, batch_tokens = 2, 8, 64
    for world in (1, 2):
        micro_steps = batch_tokens // (B * T * world)
        for rank in range(world):
            loader = ShardLoader(files, B, T, batch_tokens, DataShare(rank, world))
            # (shard, first token) of each step: 3 in the first shard, 2 in the second, wrap
            for shard, pos in [(0, 0), (0, 64), (0, 128), (1, 0), (1, 64), (0, 0), (0, 64)]:
                for i in range(micro_steps):
                    p = pos + (i * world + rank) * B * T
                    x, y = loader.next_batch()
                    np.testing.assert_array_equal(x.flatten(), tokens[shard][p : p + B * T])
                    np.testing.assert_array_equal(y.flatten(), tokens[shard][p + 1 : p + B * T + 1])
            # validation: this rank's slices of the first val_tokens of the shard, the same way
            val = val_batches(files[1], B, T, 64, DataShare(rank, world), EOT_ID)
            for k, (x, y) in enumerate(val.batches):
                p = (k * world + rank) * B * T
                np.testing.assert_array_equal(x.flatten(), tokens[1][p : p + B * T])
                np.testing.assert_array_equal(y.flatten(), tokens[1][p + 1 : p + B * T + 1])


# ---- download (local source) and tokenize ------------------------------------------------------


@pytest.fixture(scope="module")
def raw_sample(tmp_path_factory):
    out = tmp_path_factory.mktemp("raw")
    src = SourceConfig(source="local", path=str(RESOURCES / "fineweb_sample.parquet"))
    manifest = download_dataset(src, out)
    return out, manifest


def test_download_local_writes_manifest(raw_sample):
    out, manifest = raw_sample
    (entry,) = manifest["files"]
    assert entry["file"] == "fineweb_sample.parquet"
    assert entry["rows"] == manifest["rows"] == 1000
    assert entry["bytes"] == (RESOURCES / "fineweb_sample.parquet").stat().st_size
    assert len(entry["sha256"]) == 64
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert not list(out.glob("*.tmp")) and not list(out.glob("*.incomplete"))


def test_download_missing_local_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.parquet"):
        download_dataset(
            SourceConfig(source="local", path=str(tmp_path / "nothere.parquet")), tmp_path
        )
    assert not (tmp_path / "manifest.json").exists()


def _tokenize(raw_dir, out, workers, shard_tokens=200_000, val_tokens=50_000):
    cfg = TokenizeConfig(dataset="sample", shard_tokens=shard_tokens, val_tokens=val_tokens)
    return tokenize(cfg, raw_dir / "manifest.json", str(TOKENIZER_DIR), out, workers)


def expected_stream(enc, texts: list[str]) -> np.ndarray:
    """`<|endoftext|>` + the tokens of each document, in order: the shards' contract."""
    tokens = []
    for text in texts:
        tokens += [EOT_ID, *enc.encode_ordinary(text)]
    return np.array(tokens, dtype=np.uint16)


def joined_shards(out, manifest) -> np.ndarray:
    return np.concatenate([shards.read_shard(out / s["file"]) for s in manifest["shards"]])


@pytest.fixture(scope="module")
def fineweb_stream(tiktoken_gpt2, fineweb_texts) -> np.ndarray:
    """The sample's 1000 documents as the shards must hold them, encoded by tiktoken itself."""
    return expected_stream(tiktoken_gpt2, fineweb_texts)


def test_tokenize_shards_follow_the_contract(raw_sample, tmp_path, fineweb_stream):
    """Shard names, splits and sizes; joined, the shards are every document in order, as
    tiktoken's own gpt2 encoding tokenizes it."""
    raw_dir, _ = raw_sample
    m = _tokenize(raw_dir, tmp_path / "tokens", workers=2)
    files = [s["file"] for s in m["shards"]]
    assert files[0] == "sample_val_000000.bin" and files[1] == "sample_train_000001.bin"
    assert [s["split"] for s in m["shards"]] == ["val"] + ["train"] * (len(files) - 1)
    assert m["shards"][0]["tokens"] == 50_000
    assert all(s["tokens"] == 200_000 for s in m["shards"][1:-1])
    # all shards together are <|endoftext|> + tokens of each document, in order
    stream = joined_shards(tmp_path / "tokens", m)
    np.testing.assert_array_equal(stream, fineweb_stream)
    assert m["tokens"]["val"] + m["tokens"]["train"] == len(fineweb_stream)
    assert m["documents"] == 1000


def test_tokenize_identical_for_1_and_2_workers(raw_sample, tmp_path):
    raw_dir, _ = raw_sample
    one = _tokenize(raw_dir, tmp_path / "one", workers=1)
    two = _tokenize(raw_dir, tmp_path / "two", workers=2)
    assert one["shards"] == two["shards"]  # names, sizes and sha256
    for s in one["shards"]:
        assert (tmp_path / "one" / s["file"]).read_bytes() == (
            tmp_path / "two" / s["file"]
        ).read_bytes()


def test_tokenize_in_parts_writes_the_same_shards(tmp_path, fineweb_texts, fineweb_stream):
    """A dataset too big for one job: K part jobs, then the shards cut from their streams, byte
    for byte what one job writes (the plan splits by raw file; 5 parts of 3 files: empty ones)."""
    from lmpipe.data.tokenize import tokenize_part

    raw = tmp_path / "raw"
    raw.mkdir()
    files = []
    for i, chunk in enumerate((fineweb_texts[:300], fineweb_texts[300:350], fineweb_texts[350:])):
        (raw / f"d{i}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in chunk))
        files.append({"file": f"d{i}.jsonl", "rows": len(chunk)})
    (raw / "manifest.json").write_text(json.dumps({"files": files, "rows": 1000}))
    cfg = TokenizeConfig(dataset="sample", shard_tokens=200_000, val_tokens=50_000)
    whole = tokenize(cfg, raw / "manifest.json", str(TOKENIZER_DIR), tmp_path / "one", 2)
    # every document of every file, in order
    np.testing.assert_array_equal(joined_shards(tmp_path / "one", whole), fineweb_stream)
    for parts in (3, 5):
        streams = [tmp_path / f"p{parts}_{i}.bin" for i in range(parts)]
        counts = [
            tokenize_part(cfg, raw / "manifest.json", str(TOKENIZER_DIR), i, parts, path, 2)
            for i, path in enumerate(streams)
        ]
        assert sum(counts) == whole["tokens"]["val"] + whole["tokens"]["train"]
        assert counts.count(0) == parts - 3  # more parts than files: some are empty
        out = tmp_path / f"from{parts}"
        split = tokenize(cfg, raw / "manifest.json", str(TOKENIZER_DIR), out, 2, streams)
        assert split == whole  # shard names, sizes, sha256 and the document count
        for shard in whole["shards"]:
            assert (out / shard["file"]).read_bytes() == (
                tmp_path / "one" / shard["file"]
            ).read_bytes()


def test_tokenize_reads_jsonl_and_replaces_old_shards(tmp_path, tiktoken_gpt2):
    """Every jsonl document (the first and the last too), in order, each `[EOT, *tokens]` as
    tiktoken's own gpt2 encoding gives them; old shards in the output folder are gone."""
    raw = tmp_path / "raw"
    raw.mkdir()
    docs = ["first document", "second one", "  héllo <|endoftext|> wörld\n", "third"]
    (raw / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (raw / "manifest.json").write_text(json.dumps({"files": [{"file": "d.jsonl"}], "rows": 4}))
    out = tmp_path / "tokens"
    out.mkdir()
    (out / "stale_train_000009.bin").write_bytes(b"old")
    m = _tokenize(raw, out, workers=2, shard_tokens=4, val_tokens=3)
    np.testing.assert_array_equal(joined_shards(out, m), expected_stream(tiktoken_gpt2, docs))
    assert m["documents"] == 4
    assert not (out / "stale_train_000009.bin").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [s["file"] for s in m["shards"]] + ["manifest.json", "token_bytes.npy"]
    )


def test_tokenize_bad_jsonl_line_is_named(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "d.jsonl").write_text('{"text": "ok"}\nnot json\n')
    (raw / "manifest.json").write_text(json.dumps({"files": [{"file": "d.jsonl"}], "rows": 2}))
    with pytest.raises(ValueError, match=r"d.jsonl:2"):
        _tokenize(raw, tmp_path / "tokens", workers=1)
    assert not (tmp_path / "tokens").exists()


def test_tokenize_missing_text_column_is_named(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(pa.table({"content": ["a", "b"]}), raw / "d.parquet")
    (raw / "manifest.json").write_text(json.dumps({"files": [{"file": "d.parquet"}], "rows": 2}))
    with pytest.raises(KeyError, match="d.parquet.*'text'"):
        _tokenize(raw, tmp_path / "tokens", workers=1)


# ---- download (Hugging Face source; the hub itself is out of reach here, so it is faked) -------


def test_hub_download_resumes_and_never_counts_a_partial_file(tmp_path, monkeypatch, caplog):
    """An interrupted download leaves no manifest (not even an earlier one); the retry completes
    it, and the manifest lists exactly the files asked for, each with the hub's whole bytes
    (size, sha256, rows): never a partial file, not even one left by an older download.
    HF_TOKEN never shows."""
    import hashlib

    import huggingface_hub

    from lmpipe.data import download

    names = ["sample/10BT/000_00000.parquet", "sample/10BT/001_00000.parquet"]
    table = pq.read_table(RESOURCES / "fineweb_sample.parquet")
    hub = {}  # the hub's files: different rows in each
    for i, name in enumerate(names):
        buf = pa.BufferOutputStream()
        pq.write_table(table.slice(20 * i, 20), buf)
        hub[name] = buf.getvalue().to_pybytes()
    breaks = {names[1]}  # the 2nd file breaks off halfway, the first time

    def fake_hf_hub_download(repo_id, filename, repo_type, revision, local_dir):
        """huggingface_hub's contract: a complete file is returned as it is; a download goes to
        `<file>.incomplete`, resumes from the bytes there, and is renamed when complete."""
        assert repo_id == "HuggingFaceFW/fineweb" and repo_type == "dataset"
        dest = local_dir / filename
        partial = dest.with_name(dest.name + ".incomplete")
        if dest.exists():
            return str(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = hub[filename]
        have = partial.read_bytes() if partial.exists() else b""
        if filename in breaks:
            breaks.discard(filename)
            partial.write_bytes(data[: len(data) // 2])
            raise ConnectionError("connection reset")
        partial.write_bytes(have + data[len(have) :])
        partial.rename(dest)
        return str(dest)

    monkeypatch.setattr(download, "hub_data_files", lambda cfg: names)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf_hub_download)
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETSECRET")
    cfg = SourceConfig(source="huggingface", repo="HuggingFaceFW/fineweb", name="sample-10BT")
    out = tmp_path / "raw"
    # an earlier download: its manifest, and a partial file of one it no longer asks for
    (out / "sample/10BT").mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"files": [{"file": "old.parquet"}]}))
    (out / "sample/10BT/002_00000.parquet.incomplete").write_bytes(hub[names[0]][:100])
    caplog.set_level("INFO")

    with pytest.raises(ConnectionError):
        download_dataset(cfg, out)
    assert not (out / "manifest.json").exists()  # incomplete: no manifest, not the old one
    assert (out / f"{names[1]}.incomplete").exists()  # kept: the retry resumes it

    manifest = download_dataset(cfg, out)
    assert [f["file"] for f in manifest["files"]] == names
    for entry in manifest["files"]:
        data = hub[entry["file"]]
        assert entry["bytes"] == len(data) and entry["rows"] == 20, entry
        assert entry["sha256"] == hashlib.sha256(data).hexdigest(), entry
    assert manifest["rows"] == 40 and manifest["bytes"] == sum(map(len, hub.values()))
    assert json.loads((out / "manifest.json").read_text()) == manifest
    text = (out / "manifest.json").read_text() + caplog.text
    assert "SECRET" not in text and "HF_TOKEN is set" in caplog.text


def test_hub_download_max_files(tmp_path, monkeypatch):
    import huggingface_hub

    from lmpipe.data import download

    table = pq.read_table(RESOURCES / "fineweb_sample.parquet").slice(0, 5)

    def fake_hf_hub_download(repo_id, filename, repo_type, revision, local_dir):
        dest = local_dir / filename
        dest.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, dest)
        return str(dest)

    monkeypatch.setattr(download, "hub_data_files", lambda cfg: ["a.parquet", "b.parquet"])
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf_hub_download)
    cfg = SourceConfig(source="huggingface", repo="HuggingFaceFW/fineweb", name="x", max_files=1)
    assert [f["file"] for f in download_dataset(cfg, tmp_path)["files"]] == ["a.parquet"]
