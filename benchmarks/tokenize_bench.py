"""Tokenize throughput and memory: lmpipe.data.tokenize against llm.c's usual method.

Baseline (llm.c `dev/data/fineweb.py`): a process pool calling `encode_ordinary` per document
(`pool.imap(tokenize, docs, chunksize=16)`), each result turned into a uint16 array.
Ours: `lmpipe.data.tokenize` (threads over batches, `encode_to_numpy`, streamed).
Both on the same cores and the same documents; outputs are checked identical.

The serial part: the job's one main thread reads the parquet (documents into Python strings) and
writes the shards (copied into a shard's buffer, hashed, written), while the pool only encodes. So
however many cores encode, a job goes no faster than that thread: timed here alone, one thread,
on the same documents and their tokens (the plan's `tokenize.serial_tokens_per_s`).

Peak memory: the tokenize stage run as its own process (as Snakemake runs it) on the embedded
sample and on the sample repeated ten times; a streaming tokenizer's peak must not grow with it.

    python benchmarks/tokenize_bench.py [--repeats 5] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lmpipe.config import TokenizeConfig
from lmpipe.data.shards import GPT2_FORMAT, read_shard
from lmpipe.data.tokenize import ShardWriter, encode_batch, read_documents, tokenize
from lmpipe.data.tokenizer import EOT_ID, gpt2_encoding

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "resources" / "fineweb_sample.parquet"
TOKENIZER = str(REPO / "resources" / "gpt2")


def _baseline_tokenize(text: str) -> np.ndarray:
    enc = gpt2_encoding(TOKENIZER)
    return np.array([EOT_ID, *enc.encode_ordinary(text)], dtype=np.uint16)


def baseline(texts: list[str], workers: int) -> np.ndarray:
    with mp.Pool(workers) as pool:
        return np.concatenate(list(pool.imap(_baseline_tokenize, texts, chunksize=16)))


def ours(raw_manifest: Path, out: Path, workers: int) -> np.ndarray:
    cfg = TokenizeConfig(dataset="bench", shard_tokens=10**9, val_tokens=10**6)
    m = tokenize(cfg, raw_manifest, TOKENIZER, out, workers)
    return np.concatenate([read_shard(out / s["file"]) for s in m["shards"]])


def timed(fn: Callable[..., object], *args: object) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process) of fn(*args). CPU time counts only this
    process's work, so it moves less than wall time on a machine shared with other jobs."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def read_all(path: Path) -> None:
    """The main thread's read: every document of `path`, parquet to Python strings."""
    for _ in read_documents(path, "text"):
        pass


def write_all(batches: list[np.ndarray], out: Path) -> None:
    """The main thread's write: `batches` of tokens into shards (copied, hashed, written), at the
    embedded dataset's shard sizes."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = TokenizeConfig(dataset="bench", shard_tokens=500_000, val_tokens=100_000)
    writer = ShardWriter(out, cfg, GPT2_FORMAT)
    for tokens in batches:
        writer.write(tokens)
    writer.flush()


def serial_path(path: Path, out: Path, repeats: int) -> dict[str, dict[str, float]]:
    """Tokens/s of the serial part on one thread, wall and CPU, medians of `repeats`: its read,
    its write, and both."""
    batches = [encode_batch(texts, TOKENIZER) for texts in read_documents(path, "text")]
    n = sum(len(b) for b in batches)
    reads, writes = [], []
    for i in range(repeats):  # interleaved, so both see the same machine load
        reads.append(timed(read_all, path))
        writes.append(timed(write_all, batches, out / str(i)))
    rates = {}
    for clock, k in (("wall", 0), ("cpu", 1)):
        read = statistics.median(r[k] for r in reads)
        write = statistics.median(w[k] for w in writes)
        rates[clock] = {"read": n / read, "write": n / write, "both": n / (read + write)}
    return rates


def make_raw(folder: Path, table: pa.Table, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / name, row_group_size=250, compression="zstd")
    manifest = {"files": [{"file": name}], "rows": table.num_rows}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder / "manifest.json"


def peak_rss_mb(raw_manifest: Path, out: Path, workers: int) -> float:
    """Run the stage in its own process and read that process's peak RSS (wait4's rusage)."""
    cfg = json.dumps({"dataset": "bench", "shard_tokens": 1_000_000, "val_tokens": 100_000})
    cmd = [sys.executable, "-m", "lmpipe.data", "tokenize", "--config-json", cfg,
           "--raw-manifest", str(raw_manifest), "--tokenizer", TOKENIZER, "--out", str(out),
           "--workers", str(workers)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    assert status == 0, f"tokenize failed: {cmd}"
    return usage.ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    args = parser.parse_args()

    table = pq.read_table(SAMPLE, columns=["text"])
    texts = table["text"].to_pylist()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        raw = make_raw(tmp / "raw", table, "sample.parquet")
        t_base, t_ours = [], []
        for _ in range(args.repeats):  # interleaved, so both see the same machine load
            t = time.perf_counter()
            ref = baseline(texts, args.workers)
            t_base.append(time.perf_counter() - t)
            t = time.perf_counter()
            got = ours(raw, tmp / "tokens", args.workers)
            t_ours.append(time.perf_counter() - t)
        assert np.array_equal(ref, got), "outputs differ"
        n = len(got)
        base_tps, ours_tps = n / statistics.median(t_base), n / statistics.median(t_ours)
        print(f"documents {len(texts)}, tokens {n:,}, workers {args.workers}, "
              f"repeats {args.repeats} (medians); outputs identical")  # fmt: skip
        print(f"baseline (process pool, encode_ordinary per doc): {base_tps:12,.0f} tokens/s")
        print(f"lmpipe.data.tokenize (threads, batches, numpy):   {ours_tps:12,.0f} tokens/s")
        print(f"ratio: {ours_tps / base_tps:.2f}x")

        rates = serial_path(SAMPLE, tmp / "serial", args.repeats)
        for clock, r in rates.items():
            print(f"serial part, one thread, {clock} time (medians of {args.repeats}): read"
                  f" {r['read']:,.0f}, write {r['write']:,.0f}, both {r['both']:,.0f} tokens/s;"
                  f" {r['both'] / ours_tps:.1f}x the stage on {args.workers} workers")  # fmt: skip

        raw10 = make_raw(tmp / "raw10", pa.concat_tables([table] * 10), "sample10.parquet")
        rss1 = peak_rss_mb(raw, tmp / "m1", args.workers)
        rss10 = peak_rss_mb(raw10, tmp / "m10", args.workers)
        print(f"peak RSS of the stage: sample {rss1:.0f} MB, sample x10 {rss10:.0f} MB "
              f"(ratio {rss10 / rss1:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
