"""Training throughput on the CPU: lmpipe's trainer vs Hugging Face GPT2LMHeadModel in a plain loop.

Same tiny GPT-2 (2 layers, 2 heads, 64 wide, vocab 50257), same batch (micro-batch x seq_len
tokens, grad accumulation to the same tokens a step), same steps, same AdamW and clipping, same
threads. Each side runs in its own process, alternating, `--repeats` times; a run's figure is
its median step time after `--warmup` steps, and the figure printed is the median over repeats.

    python benchmarks/train_throughput.py [--threads 2] [--steps 12] [--repeats 3] [--compile]
    python benchmarks/train_throughput.py --one-rank [--dtype bfloat16] [--compile]

`--one-rank`: lmpipe's trainer on one rank wrapped in FSDP2 (`fsdp.shard: always`) against the
plain model (`never`), alternating, instead of against HF: what `fsdp.shard`'s default rests on.

lmpipe runs for real (`python -m lmpipe.train.pretrain`, the trainer's worker as one process,
FSDP on a 1-rank gloo group) and its tokens/s come from its metrics.jsonl; the HF loop times
itself the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 128}


def make_tokens(folder: Path) -> Path:
    """Real FineWeb text from resources/ as llm.c shards, with a manifest."""
    import pyarrow.parquet as pq

    sys.path.insert(0, str(REPO / "workflow"))
    from lmpipe.data.shards import write_shard
    from lmpipe.data.tokenizer import gpt2_encoding

    enc = gpt2_encoding(str(REPO / "resources" / "gpt2"))
    texts = pq.read_table(REPO / "resources" / "fineweb_sample.parquet", columns=["text"])
    tokens: list[int] = []
    for text in texts["text"].to_pylist()[:150]:
        tokens += [50256, *enc.encode_ordinary(text)]
    tokens = np.array(tokens, dtype=np.uint16)
    shards = []
    for i, (split, part) in enumerate([("val", tokens[:8192]), ("train", tokens[8192:])]):
        name = f"bench_{split}_{i:06d}.bin"
        write_shard(folder / name, part)
        shards.append({"file": name, "split": split, "tokens": len(part)})
    (folder / "manifest.json").write_text(json.dumps({"dataset": "bench", "shards": shards}))
    return folder / "manifest.json"


def lmpipe_run(args, manifest: Path, out: Path, shard: str = "always") -> float:
    """tokens/s of lmpipe's trainer: the median of its steps after the warm-up."""
    sys.path.insert(0, str(REPO / "workflow"))
    from lmpipe.config import FSDPConfig, ScheduleConfig, TrainConfig
    from lmpipe.registry import AdamWSettings

    tc = TrainConfig(
        seq_len=args.seq_len, micro_batch=args.micro_batch, batch_tokens=args.batch_tokens,
        optimizer=AdamWSettings(name="adamw", lr=1e-3, betas=(0.9, 0.95), fused=args.fused),
        max_steps=args.steps, schedule=ScheduleConfig(warmup_steps=2), val_every=0,
        val_tokens=1024, checkpoint_every=0, compile=args.compile, dtype=args.dtype,
        fsdp=FSDPConfig(shard=shard),
    )  # fmt: skip
    full = dataclasses.asdict(tc)  # every setting spelled out, the optimizer's with its name
    cfg = {
        "run": "bench",
        "dataset": "bench",
        "model": MODEL | {"vocab_size": 50257, "padded_vocab_size": 50304},
        "train": full,
        "launch": {"device": "cpu", "nodes": 1, "procs_per_node": 1, "peak_flops": 1e12},
    }
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, "-m", "lmpipe.train.pretrain", "--config-json", json.dumps(cfg)]
    cmd += ["--data", str(manifest), "--out", str(out)]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median([r["tokens_per_s"] for r in rows if "loss" in r][args.warmup :])


HF_LOOP = r"""
import json, sys, time, statistics
import numpy as np, torch
from transformers import GPT2Config, GPT2LMHeadModel
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
torch.manual_seed(1337)
m = a["model"]
model = GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=m["block_size"],
    n_embd=m["n_embd"], n_layer=m["n_layer"], n_head=m["n_head"], activation_function="gelu_new",
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).train()
decay = [p for p in model.parameters() if p.dim() >= 2]
other = [p for p in model.parameters() if p.dim() < 2]
groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=a["fused"])
tokens = np.fromfile(a["shard"], dtype="<u2", offset=1024).astype(np.int64)
B, T = a["micro_batch"], a["seq_len"]
accum = a["batch_tokens"] // (B * T)
pos, times = 0, []
for step in range(a["steps"]):
    t0 = time.time()
    for _ in range(accum):
        buf = torch.from_numpy(tokens[pos : pos + B * T + 1]); pos += B * T
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        (loss / accum).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    loss.item()
    times.append(time.time() - t0)
print(a["batch_tokens"] / statistics.median(times[a["warmup"]:]))
"""


def hf_run(args, manifest: Path) -> float:
    shard = next(manifest.parent.glob("bench_train_*.bin"))
    spec = vars(args) | {"model": MODEL, "shard": str(shard)}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run(
        [sys.executable, "-c", HF_LOOP, json.dumps(spec)], env=env, check=True, capture_output=True
    )
    return float(out.stdout.decode().split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--compile", action="store_true", help="lmpipe with torch.compile")
    parser.add_argument("--fused", action="store_true", help="fused AdamW (both)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--one-rank", action="store_true", help="one rank: FSDP2 against the plain model"
    )
    args = parser.parse_args()
    if args.one_rank:
        return one_rank(args)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = make_tokens(Path(tmp))
        ours, theirs = [], []
        for i in range(args.repeats):
            t = time.time()
            ours.append(lmpipe_run(args, manifest, Path(tmp) / f"run{i}"))
            theirs.append(hf_run(args, manifest))
            print(
                f"repeat {i + 1}: lmpipe {ours[-1]:,.0f} tok/s, HF {theirs[-1]:,.0f} tok/s"
                f" ({time.time() - t:.0f} s)",
                flush=True,
            )
    a, b = statistics.median(ours), statistics.median(theirs)
    print(
        f"config: {MODEL}, seq {args.seq_len}, micro-batch {args.micro_batch},"
        f" {args.batch_tokens} tokens a step, {args.threads} threads, compile={args.compile}"
    )
    print(f"lmpipe trainer : {a:,.0f} tokens/s (median of {args.repeats})")
    print(f"HF GPT2 loop   : {b:,.0f} tokens/s (median of {args.repeats})")
    print(f"ratio          : {a / b:.2f}x (goal >= 1.2x)")


def one_rank(args) -> None:
    """tokens/s of the trainer on one rank, FSDP2-wrapped and plain, side by side."""
    with tempfile.TemporaryDirectory() as tmp:
        manifest = make_tokens(Path(tmp))
        runs: dict[str, list[float]] = {"always": [], "never": []}
        for i in range(args.repeats):
            for shard, figures in runs.items():
                figures.append(lmpipe_run(args, manifest, Path(tmp) / f"{shard}{i}", shard))
            print(
                f"repeat {i + 1}: FSDP2 {runs['always'][-1]:,.0f} tok/s,"
                f" plain {runs['never'][-1]:,.0f} tok/s",
                flush=True,
            )
    fsdp, plain = (statistics.median(runs[k]) for k in ("always", "never"))
    print(
        f"config: {MODEL}, seq {args.seq_len}, micro-batch {args.micro_batch},"
        f" {args.batch_tokens} tokens a step, {args.threads} threads, compile={args.compile},"
        f" dtype {args.dtype}"
    )
    print(f"one rank, FSDP2 (shard always): {fsdp:,.0f} tokens/s (median of {args.repeats})")
    print(f"one rank, plain (shard never) : {plain:,.0f} tokens/s (median of {args.repeats})")
    print(f"ratio plain / FSDP2           : {plain / fsdp:.2f}x")


if __name__ == "__main__":
    main()
