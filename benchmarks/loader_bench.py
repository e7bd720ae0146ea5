"""What one rank's training loader delivers: the bare ShardLoader against lmpipe.data.prefetch.

The 124M recipe's shapes (config/config.yaml runs.124m): micro-batch 64 x 1024, 8 ranks,
524,288 tokens a step (one micro-batch a rank a step), this rank's slice of each step read from a
real llm.c shard (the embedded FineWeb sample's tokens repeated to `--shard-tokens`, in a temp
dir). Loaders, each fresh for every repeat, repeats interleaved:

- `bare`: ShardLoader, as the trainer uses it today (memmap slice -> int64 on the loop's thread);
- `prefetch`: Prefetcher(ShardLoader, pin=False): made ahead on a thread;
- `prefetch+pin`: the same, pinned (only where CUDA is: pinned memory needs an accelerator);
- `ready` (blocked time only): a batch already made, handed out: the floor on this machine.

The consumer does what the loop does with a batch: `x.to(device, non_blocking=True)` (a no-op on
the CPU). Two measures, medians over `--repeats`:

1. tokens/s delivered to the rank when the consumer does nothing else, against the goal:
   20 x 550,000 = 11.0M tokens/s a rank (20x what a rank trains at);
2. how long `next_batch()` blocks the consumer when it does `--work-ms` of other work a
   micro-batch: a sleep (a GPU step the loop waits on, the GIL free) or a spin (Python holding
   the GIL, the worst case for a thread). At 550K tokens/s a rank, a 65,536-token micro-batch
   is ~119 ms of GPU work; the default 20 ms is shorter, so harder on the read-ahead.

`--workers N` runs N ranks' loaders at once, one process each (ranks of one node share its cores
and page cache), and reports the median rank.

    python benchmarks/loader_bench.py [--repeats 5] [--tokens 200e6] [--workers 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from lmpipe.data.loader import DataShare, ShardLoader
from lmpipe.data.prefetch import Prefetcher
from lmpipe.data.shards import write_shard
from lmpipe.data.tokenizer import EOT_ID, gpt2_encoding

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "resources" / "fineweb_sample.parquet"
TOKENIZER = str(REPO / "resources" / "gpt2")
B, T, WORLD, BATCH_TOKENS = 64, 1024, 8, 524_288  # runs.124m, 8 GPUs
GOAL = 20 * 550_000  # tokens/s a rank


def make_shard(folder: Path, min_tokens: int) -> Path:
    """The embedded sample's GPT-2 tokens, repeated to at least `min_tokens`, as one shard."""
    texts = pq.read_table(SAMPLE, columns=["text"])["text"].to_pylist()
    enc = gpt2_encoding(TOKENIZER)
    docs = enc.encode_ordinary_batch(texts)
    tokens = np.concatenate([np.array([EOT_ID, *d], dtype=np.uint16) for d in docs])
    tokens = np.tile(tokens, -(-min_tokens // len(tokens)))
    write_shard(folder / "bench_000000.bin", tokens)
    return folder / "bench_000000.bin"


class Ready:
    """The floor: a batch that is already made, handed out with no loading and no thread."""

    def __init__(self):
        self.batch = (torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long))

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch


def build(variant: str, shard: Path, rank: int, depth: int):
    if variant == "ready":
        return Ready()
    loader = ShardLoader([shard], B, T, BATCH_TOKENS, DataShare(rank, WORLD))
    if variant == "bare":
        return loader
    return Prefetcher(loader, depth=depth, pin=variant == "prefetch+pin")


def consume(loader, batches: int, device: torch.device, work) -> tuple[float, list[float]]:
    """Wall time for `batches` micro-batches, and each next_batch()'s blocked time."""
    loader.next_batch()  # the thread started, the shard mapped: not what is measured
    blocked = []
    t0 = time.perf_counter()
    for _ in range(batches):
        t = time.perf_counter()
        x, y = loader.next_batch()
        blocked.append(time.perf_counter() - t)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        work()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, blocked


def work_fn(kind: str, ms: float):
    if ms <= 0:
        return lambda: None
    if kind == "sleep":
        return lambda: time.sleep(ms / 1000)

    def spin() -> None:  # pure Python: holds the GIL but for the interpreter's switches
        end = time.perf_counter() + ms / 1000
        while time.perf_counter() < end:
            pass

    return spin


def run_rank(args: argparse.Namespace, shard: Path, rank: int, variants: list[str]) -> dict:
    """{variant: {"tps": [...], "blocked": [[...] a repeat]}} for one rank."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n = max(1, int(args.tokens) // (B * T))
    out = {v: {"tps": [], "blocked": []} for v in variants}
    for _ in range(args.repeats):  # interleaved, so every variant sees the same machine load
        for v in variants:
            loader = build(v, shard, rank, args.depth)
            elapsed, _ = consume(loader, n, device, work_fn("sleep", 0))
            out[v]["tps"].append(n * B * T / elapsed)
            work = work_fn(args.work, args.work_ms)
            _, blocked = consume(loader, args.work_batches, device, work)
            out[v]["blocked"].append(blocked)
            if isinstance(loader, Prefetcher):
                loader.close()
    return out


def _worker(args, shard, rank, variants, barrier, results) -> None:
    barrier.wait()  # every rank starts together
    results.put(run_rank(args, shard, rank, variants))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=float, default=200e6, help="tokens a rank a repeat")
    parser.add_argument("--shard-tokens", type=float, default=24e6)
    parser.add_argument("--workers", type=int, default=1, help="ranks at once, a process each")
    parser.add_argument("--depth", type=int, default=2, help="Prefetcher's read-ahead")
    parser.add_argument("--work", choices=["sleep", "spin"], default="sleep")
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--work-batches", type=int, default=30)
    args = parser.parse_args()

    variants = ["bare", "prefetch"] + (["prefetch+pin"] if torch.cuda.is_available() else [])
    variants.append("ready")
    with tempfile.TemporaryDirectory() as tmp:
        shard = make_shard(Path(tmp), int(args.shard_tokens))
        tokens = (shard.stat().st_size - 1024) // 2
        if args.workers == 1:
            ranks = [run_rank(args, shard, 0, variants)]
        else:
            ctx = mp.get_context("spawn")
            barrier, results = ctx.Barrier(args.workers), ctx.Queue()
            procs = [
                ctx.Process(target=_worker, args=(args, shard, r, variants, barrier, results))
                for r in range(args.workers)
            ]
            for p in procs:
                p.start()
            ranks = [results.get() for _ in procs]
            for p in procs:
                p.join()

    device = "cuda" if torch.cuda.is_available() else "cpu (no CUDA: pinning not measured)"
    print(f"shard {tokens:,} tokens; micro-batch {B} x {T}, {WORLD} ranks, {BATCH_TOKENS:,}"
          f" tokens a step; {args.workers} rank(s) at once; repeats {args.repeats} (medians);"
          f" device {device}; read-ahead {args.depth}")  # fmt: skip
    print(f"goal: 20 x 550,000 = {GOAL / 1e6:.1f}M tokens/s a rank\n")
    print(f"{'loader':14} {'tokens/s a rank':>16} {'vs bare':>8} {'vs goal':>8}   next_batch()"
          f" blocked, {args.work} {args.work_ms:g} ms a batch: median / p90 / max")  # fmt: skip
    base = None
    for v in variants:
        # the median rank of each rank's median repeat
        tps = statistics.median(statistics.median(r[v]["tps"]) for r in ranks)
        base = base or tps
        waits = np.array([w for r in ranks for rep in r[v]["blocked"] for w in rep]) * 1e6
        med, p90, top = np.median(waits), np.percentile(waits, 90), waits.max()
        rate = (f"{tps / 1e6:13,.1f}M/s {tps / base:7.2f}x {tps / GOAL:7.1f}x" if v != "ready"
                else f"{'-':>16} {'-':>8} {'-':>8}")  # fmt: skip
        print(f"{v:14} {rate}   {med:8.1f} / {p90:8.1f} / {top:8.1f} us")
    print("ready: a batch already made, no loading: the floor of a hand-out on this machine")


if __name__ == "__main__":
    main()
