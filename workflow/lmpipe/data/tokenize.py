"""The tokenize stage: raw documents -> llm.c token shards, streamed and parallel.

The tokenizer is GPT-2's BPE (tiktoken, from resources/gpt2), or, for the text of an `arch: hf`
model's runs, that model's own (its folder's AutoTokenizer: lmpipe.data.tokenizer), its ids in
uint32 shards where they exceed uint16 (llm.c's format). Each document becomes the end of text
(GPT-2's `<|endoftext|>`, a model's eos token) followed by its tokens; documents are
concatenated and cut into shards of `shard_tokens` (the first, the validation shard, holds
`val_tokens`), so documents split across shard boundaries as in llm.c's `dev/data/fineweb.py`.

Speed and memory: documents are read a parquet batch (or a block of jsonl lines) at a time and
encoded by a pool of threads (tiktoken's Rust core releases the GIL; `encode_to_numpy` skips the
Python list that `encode_ordinary` builds). At most a few batches are in flight, so memory does not
grow with the dataset. Results are consumed in input order, so the shards are byte-identical for any
number of workers. The reading and the writing stay on the main thread, which caps a job's speed
however many workers encode (lmpipe.costs plans with that cap; benchmarks/tokenize_bench.py
measures it).

Beside the shards, `token_bytes.npy` holds each token id's length in UTF-8 bytes (special tokens
0: lmpipe.data.token_bytes), which the manifest names: scoring turns a loss into bits per byte
with it, and needs no tokenizer.

Shards are written into a temporary folder that replaces the output folder at the end, so an
interrupted run never leaves a mix of old and new shards.

    python -m lmpipe.data tokenize --config-json J --raw-manifest M --tokenizer resources/gpt2 \
        --out results/data/D/tokens --workers 16

A dataset too large for one job's time limit (lmpipe.costs decides) is tokenized in parts: part i
of K encodes its slice of the raw files into one token stream (`--part i --parts K --out FILE`,
the shard format, one long "shard"), and the shards are then cut from the parts' streams in order
(`--from-parts P0 P1 ...`): byte for byte the shards one job would have written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from tqdm import tqdm

from lmpipe import manifests
from lmpipe.config import TokenizeConfig, build
from lmpipe.data import token_bytes
from lmpipe.data.shards import ShardFormat, header_bytes, read_shard, shard_format
from lmpipe.data.tokenizer import Tokenizer, load_tokenizer
from lmpipe.files import atomic_dir, atomic_file
from lmpipe.paths import shard_name

log = logging.getLogger("lmpipe.tokenize")

BATCH_DOCS = 256  # documents a task: large enough to amortise, small enough to stream


def read_documents(path: Path, text_column: str) -> Iterator[list[str]]:
    """Yield lists of document texts from a parquet or jsonl file, a batch at a time; a plain
    .txt file is one document (e.g. a book)."""
    if path.suffix == ".parquet":
        pf = pq.ParquetFile(path)
        if text_column not in pf.schema_arrow.names:
            raise KeyError(f"{path}: no column {text_column!r} (columns: {pf.schema_arrow.names})")
        for batch in pf.iter_batches(batch_size=BATCH_DOCS, columns=[text_column]):
            yield batch.column(0).to_pylist()
    elif path.suffix == ".jsonl":
        batch: list[str] = []
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    batch.append(json.loads(line)[text_column])
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(
                        f"{path}:{lineno}: not a JSON object with {text_column!r}"
                    ) from e
                if len(batch) == BATCH_DOCS:
                    yield batch
                    batch = []
        if batch:
            yield batch
    elif path.suffix == ".txt":
        yield [path.read_text()]
    else:
        raise ValueError(f"{path}: expected a .parquet, .jsonl or .txt file")


def encode_batch(texts: list[str], tokenizer_dir: str) -> np.ndarray:
    """The end of text + tokens for each document, concatenated, in the shards' dtype."""
    enc = load_tokenizer(tokenizer_dir)
    parts = []
    eot = np.array([enc.eot_token], dtype=np.uint32)
    if hasattr(enc, "encode_to_numpy"):  # tiktoken (GPT-2): no Python list between
        encoded = (enc.encode_to_numpy(text, disallowed_special=()) for text in texts)
    else:  # a Hugging Face tokenizer: the batch at once (its Rust core spreads it itself)
        encoded = (np.asarray(ids, dtype=np.uint32) for ids in enc.encode_ordinary_batch(texts))
    for tokens in encoded:  # (disallowed_special=(): encode_ordinary, special text as text)
        parts.append(eot)
        parts.append(tokens)
    return np.concatenate(parts).astype(tokens_format(tokenizer_dir).dtype)


def tokens_format(tokenizer_dir: str) -> ShardFormat:
    """The shard format the tokenizer's ids fit: uint16 for GPT-2's 50,257, uint32 above 65,536."""
    return shard_format(load_tokenizer(tokenizer_dir).n_vocab)


def ordered_map(pool: ThreadPoolExecutor, fn, items, window: int) -> Iterator:
    """`pool.map` in input order with at most `window` tasks in flight (bounded memory)."""
    pending: deque = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


class ShardWriter:
    """Fills shards of fixed size from a stream of token arrays; hashes as it writes."""

    def __init__(self, out: Path, cfg: TokenizeConfig, fmt: ShardFormat):
        self.out, self.cfg, self.fmt = out, cfg, fmt
        self.index, self.shards = 0, []
        self.buffer = np.empty(cfg.val_tokens, dtype=fmt.dtype)
        self.filled = 0

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            take = min(len(tokens), len(self.buffer) - self.filled)
            self.buffer[self.filled : self.filled + take] = tokens[:take]
            self.filled += take
            tokens = tokens[take:]
            if self.filled == len(self.buffer):
                self.flush()

    def flush(self) -> None:
        if self.filled == 0:
            return
        split = "val" if self.index == 0 else "train"
        name = shard_name(self.cfg.dataset, split, self.index)
        data = header_bytes(self.filled, self.fmt) + self.buffer[: self.filled].tobytes()
        (self.out / name).write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        self.shards.append({"file": name, "split": split, "tokens": self.filled, "sha256": sha})
        self.index += 1
        self.filled = 0
        if len(self.buffer) != self.cfg.shard_tokens:
            self.buffer = np.empty(self.cfg.shard_tokens, dtype=self.fmt.dtype)


def raw_files(raw_manifest: Path, part: int = 0, parts: int = 1) -> tuple[list[Path], int]:
    """The raw files of part `part` of `parts` (consecutive slices, in the manifest's order), and
    the documents they hold (for the progress bar)."""
    entries = manifests.read_raw(raw_manifest).files
    mine = entries[part * len(entries) // parts : (part + 1) * len(entries) // parts]
    return [f.file for f in mine], sum(f.rows for f in mine)


def encoded(
    files: list[Path], text_column: str, tokenizer_dir: str, workers: int, rows: int, desc: str
) -> Iterator[tuple[int, np.ndarray]]:
    """(documents, their tokens) of `files`, batch by batch, in order, encoded by `workers`
    threads."""
    load_tokenizer(tokenizer_dir)  # load (and check) the tokenizer once, before the threads

    def batches() -> Iterator[list[str]]:
        for path in files:
            yield from read_documents(path, text_column)

    with (
        tqdm(total=rows, desc=desc, unit="doc", file=sys.stderr) as progress,
        ThreadPoolExecutor(max_workers=workers) as pool,
    ):
        encode = lambda texts: (len(texts), encode_batch(texts, tokenizer_dir))  # noqa: E731
        for n, tokens in ordered_map(pool, encode, batches(), window=2 * workers):
            yield n, tokens
            progress.update(n)


def from_parts(
    parts: list[Path], eot: int, chunk: int = 1 << 24
) -> Iterator[tuple[int, np.ndarray]]:
    """(documents, tokens) read back from part streams, in order: a document starts with its
    end-of-text token, and the text's own tokens never are one."""
    for part in tqdm(parts, desc="shards from parts", unit="part", file=sys.stderr):
        tokens = read_shard(part)
        for start in range(0, len(tokens), chunk):
            piece = np.asarray(tokens[start : start + chunk])
            yield int((piece == eot).sum()), piece


def tokenize_part(
    cfg: TokenizeConfig,
    raw_manifest: Path,
    tokenizer_dir: str,
    part: int,
    parts: int,
    out_file: Path,
    workers: int,
) -> int:
    """Part `part` of `parts`: its raw files' tokens as one stream in the shard format."""
    files, rows = raw_files(raw_manifest, part, parts)
    count, fmt = 0, tokens_format(tokenizer_dir)
    with atomic_file(out_file) as tmp, open(tmp, "wb") as f:
        f.write(header_bytes(0, fmt))  # the count is written last, once known
        desc = f"tokenize {cfg.dataset} part {part + 1}/{parts}"
        for _, tokens in encoded(files, cfg.text_column, tokenizer_dir, workers, rows, desc):
            f.write(tokens.tobytes())
            count += len(tokens)
        f.seek(0)
        f.write(header_bytes(count, fmt))
    return count


def tokenize(
    cfg: TokenizeConfig,
    raw_manifest: Path,
    tokenizer_dir: str,
    out: Path,
    workers: int,
    parts: list[Path] | None = None,
    tokens_of: str | None = None,
) -> dict[str, Any]:
    """The dataset's shards and manifest.json into `out`: from the raw files, or from the token
    streams of its parts (`parts`, in order). `tokens_of`: the model whose tokenizer this is
    (an `arch: hf` entry of `models:`), said in the manifest."""
    enc: Tokenizer = load_tokenizer(tokenizer_dir)
    if parts:
        stream = from_parts(parts, enc.eot_token)
    else:
        files, rows = raw_files(raw_manifest)
        desc = f"tokenize {cfg.dataset}"
        stream = encoded(files, cfg.text_column, tokenizer_dir, workers, rows, desc)

    with atomic_dir(out) as tmp:
        writer = ShardWriter(tmp, cfg, tokens_format(tokenizer_dir))
        docs = 0
        for n, tokens in stream:
            writer.write(tokens)
            docs += n
        writer.flush()
        table, how = token_bytes.token_bytes(enc)  # each id's UTF-8 bytes: bits per byte

        manifest = {
            "dataset": cfg.dataset,
            "tokenizer": enc.name,  # "gpt2", or "hf <sha256 of its files>"
            **({"tokens_of": tokens_of} if tokens_of else {}),
            "eot": enc.eot_token,
            "token_bytes": {"file": token_bytes.save(table, tmp), "how": how},
            "documents": docs,
            "shard_tokens": cfg.shard_tokens,
            "shards": writer.shards,
            "tokens": {
                split: sum(s["tokens"] for s in writer.shards if s["split"] == split)
                for split in ("val", "train")
            },
        }
        manifests.write(tmp / manifests.MANIFEST, manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-json", required=True, help="lmpipe.config.tokenize_params")
    parser.add_argument("--raw-manifest", required=True, type=Path)
    parser.add_argument(
        "--tokenizer", required=True,
        help="GPT-2's folder (encoder.json, vocab.bpe), or a Hugging Face model's folder",
    )  # fmt: skip
    parser.add_argument("--tokens-of", help="the `models:` entry whose tokenizer this is")
    parser.add_argument("--out", required=True, type=Path, help="tokens folder (a part: its file)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--part", type=int, help="tokenize part PART (0-based) of --parts only")
    parser.add_argument("--parts", type=int, default=1, help="parts the raw files are split in")
    parser.add_argument(
        "--from-parts", nargs="+", type=Path, help="cut the shards from these parts' streams"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    cfg = build(TokenizeConfig, json.loads(args.config_json), "dataset")
    workers = max(1, args.workers)
    if args.part is not None:
        if not 0 <= args.part < args.parts:
            parser.error(f"--part {args.part} is not one of 0..{args.parts - 1}")
        n = tokenize_part(
            cfg, args.raw_manifest, args.tokenizer, args.part, args.parts, args.out, workers
        )
        log.info("part %d of %d: %d tokens -> %s", args.part, args.parts, n, args.out)
        return
    m = tokenize(
        cfg, args.raw_manifest, args.tokenizer, args.out, workers, args.from_parts, args.tokens_of
    )
    log.info(
        "%d documents -> %d shards, %d val + %d train tokens in %s",
        m["documents"], len(m["shards"]), m["tokens"]["val"], m["tokens"]["train"], args.out,
    )  # fmt: skip


if __name__ == "__main__":
    main()
