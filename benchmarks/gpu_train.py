"""GPT-2 124M training throughput on one GPU, through the trainer's own code path.

The model, FSDP2 wrapping (a one-rank NCCL group), bf16 mixed precision, per-block
torch.compile, fused AdamW and clipping are lmpipe's (`lmpipe.train.parallel`,
`lmpipe.train.optim`); the tokens are random (data loading is not what is measured). For each
micro-batch size: `--warmup` steps (compilation), then `--steps` timed steps; prints tokens/s,
MFU against `--peak-flops` (llm.c's 6N + 6LCT FLOPs a token) and peak memory. Results also go to
$OUT/gpu_train.json.

    python benchmarks/gpu_train.py --peak-flops 989e12 --micro-batches 16 32 64
    (H100/H200 SXM bf16 dense: 989e12; A100: 312e12. Goal on one H200: >= 550K tokens/s.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
from lmpipe.config import ModelConfig  # noqa: E402
from lmpipe.models.gpt2.model import GPT  # noqa: E402
from lmpipe.registry import AdamWSettings  # noqa: E402
from lmpipe.train.optim import build_optimizer, clip_grad_norm  # noqa: E402
from lmpipe.train.parallel import init_distributed, parallelize  # noqa: E402

PRESETS: dict[str, ModelConfig] = {  # GPT-2's sizes (config/config.yaml names them too)
    "d12": ModelConfig(n_layer=12, n_head=12, n_embd=768),  # 124M
    "d24": ModelConfig(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "d36": ModelConfig(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "d48": ModelConfig(n_layer=48, n_head=25, n_embd=1600),  # 1558M
    "tiny": ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=128),
    "small": ModelConfig(n_layer=4, n_head=4, n_embd=128, block_size=256),
}


def measure(micro_batch: int, args: argparse.Namespace, device: torch.device) -> dict:
    T = 1024
    torch.manual_seed(0)
    model = parallelize(GPT(PRESETS[args.preset]), device, "bfloat16", not args.no_compile)
    optimizer = build_optimizer(model, AdamWSettings(name="adamw", lr=6e-4, fused=True))
    x = torch.randint(0, 50257, (micro_batch, T), device=device)
    y = torch.randint(0, 50257, (micro_batch, T), device=device)
    torch.cuda.reset_peak_memory_stats()

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        _, loss = model(x, y)
        loss.backward()
        clip_grad_norm(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step(model, optimizer)
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(args.steps):
        step(model, optimizer)
    torch.cuda.synchronize()  # host sync: wait for the timed steps
    dt = (time.time() - t0) / args.steps
    tokens_per_s = micro_batch * T / dt
    mfu = model.flops_per_token(T) * tokens_per_s / args.peak_flops
    result = {
        "preset": args.preset,
        "micro_batch": micro_batch,
        "seq_len": T,
        "ms_per_step": dt * 1000,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "compile": not args.no_compile,
    }
    del model, optimizer
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="d12", choices=list(PRESETS))
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peak-flops", type=float, default=989e12)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    d = init_distributed("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    results = []
    try:
        for mb in args.micro_batches:
            try:
                r = measure(mb, args, d.device)
            except torch.OutOfMemoryError:
                print(f"micro-batch {mb}: out of memory", flush=True)
                torch.cuda.empty_cache()
                continue
            results.append(r)
            print(
                f"micro-batch {mb:3d} x 1024: {r['tokens_per_s']:,.0f} tokens/s,"
                f" {r['ms_per_step']:.1f} ms/step, MFU {100 * r['mfu']:.1f}%"
                f" (peak {args.peak_flops:.3g}), peak memory {r['peak_memory_gib']:.1f} GiB",
                flush=True,
            )
    finally:
        dist.destroy_process_group()
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_train.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
