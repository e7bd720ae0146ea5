"""GPT-2 training throughput on one GPU, through the trainer's own code path.

The model is the trainer's own (`lmpipe.train.loop.training_model`: on a GPU the head's GEMM on
the 50,304 padded rows, the loss as `--loss-chunk-tokens` sets it, activation checkpointing as
`--recompute` does), with its FSDP2 wrapping (a one-rank NCCL group), bf16 mixed precision,
torch.compile as `--compile-scope` and `--compile-mode` set it (train.compile_scope: the stem,
blocks and tail as regions by default; blocks only; the whole model), fused AdamW and clipping
(`lmpipe.train.parallel`, `lmpipe.train.optim`) and the trainer's TF32 settings; the tokens are
random (data loading is not what is measured). For each micro-batch size: `--warmup` steps
(compilation), then `--steps` timed steps; prints tokens/s, MFU (llm.c's 6N + 6LCT FLOPs a
token) against the GPU's dense bf16 peak (`lmpipe.hardware`, or `--peak-flops`), and the
steady-state peak memory (the counter is reset after the warm-up, so compile-time allocations do
not count; the warm-up's peak is reported apart).

Each micro-batch size runs in a process of its own: Dynamo caches compiled graphs per code object,
so a second size in the same process would be timed on a recompiled, dynamic-shape graph.
One profiled step after the timed ones names the attention kernels that ran (flash or not), and
the SDPA kernel's aten op as the trainer's provenance.json names it
(`lmpipe.models.attention.kernel_ops`).

    python benchmarks/gpu_train.py --micro-batches 16 32 64            # d12 (124M), seq 1024
    python benchmarks/gpu_train.py --preset d24 --micro-batches 32     # 350M
    python benchmarks/gpu_train.py --micro-batches 64 --compile-scope model \
        --compile-mode reduce-overhead                                  # one graph, CUDA graphs
    python benchmarks/gpu_train.py --device cpu --preset tiny --seq-len 128 --no-compile \\
        --dtype float32 --micro-batches 2 4 --warmup 2 --steps 2       # the code path, on a CPU

Results go to `--json PATH` if given, else to $OUT/gpu_train.json when $OUT is set.
(Goal on one H200: >= 550K tokens/s for d12.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
from lmpipe.config import (  # noqa: E402
    COMPILE_MODES,
    COMPILE_SCOPES,
    CUDA_GRAPH_MODES,
    ModelConfig,
    compile_problem,
    named_models,
    train_config,
)
from lmpipe.data.loader import val_set  # noqa: E402
from lmpipe.data.shards import GPT2_EOT  # noqa: E402
from lmpipe.eval import val_loss  # noqa: E402
from lmpipe.hardware import CPU_NOMINAL_PEAK, gpu_peak_flops  # noqa: E402
from lmpipe.models.attention import kernel_ops  # noqa: E402
from lmpipe.models.head_loss import LOSS_KERNELS  # noqa: E402
from lmpipe.train.fp8 import after_optimizer_step, fp8_problem  # noqa: E402
from lmpipe.train.loop import training_model  # noqa: E402
from lmpipe.train.optim import build_optimizer, clip_grad_norm  # noqa: E402
from lmpipe.train.parallel import init_distributed  # noqa: E402

# GPT-2's sizes and the CPU demo's, by their names in config/config.yaml, and a small one
PRESETS: dict[str, ModelConfig] = named_models() | {
    "small": ModelConfig(n_layer=4, n_head=4, n_embd=128, block_size=256),
}
ATTENTION_OP = re.compile(r"attention|flash|fmha|sdpa", re.IGNORECASE)


def device_info(device: torch.device) -> dict:
    """The GPU (or CPU), torch and CUDA versions, and whether flash attention is available: the
    SDPA switch, and a bf16 (B, nh, T, hs) call with only the flash backend allowed."""
    info = {
        "device": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "flash_sdp_enabled": torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient_sdp_enabled": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
    }
    if device.type != "cuda":
        info["device_name"] = "cpu"
        return info
    info["device_name"] = torch.cuda.get_device_name(device)
    info["capability"] = list(torch.cuda.get_device_capability(device))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(4, 12, 1024, 64, device=device, dtype=torch.bfloat16)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        torch.cuda.synchronize(device)
        info["flash_probe"] = "ok"
    except RuntimeError as e:  # "No available kernel" when flash cannot run this input
        info["flash_probe"] = f"failed: {str(e).splitlines()[0]}"
    return info


def attention_timings(
    device: torch.device, shape: tuple[int, int, int, int], dtype: torch.dtype, repeats: int = 10
) -> dict[str, dict[str, Any]]:
    """Each train.attention_backend the device has kernels for, timed on one causal attention
    forward + backward of (B, nh, T, hs) `shape` through lmpipe's own `attend`: the median
    milliseconds over `repeats` calls after 3 warm-up calls, and the kernel that ran; or why it
    cannot run. Which setting to choose on this GPU (cuDNN attention on Hopper, or flash), read
    off the figures. math is left out on CUDA: never the fast one, and it holds the scores."""
    from lmpipe.models import attention

    cuda = device.type == "cuda"
    names = [n for n in attention.BACKENDS if n != "math"] if cuda else attention.CPU_BACKENDS
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in "qkv")

    def step() -> None:
        attention.attend(q, k, v, None).sum().backward()
        if cuda:
            torch.cuda.synchronize(device)

    timings: dict[str, dict[str, Any]] = {}
    try:
        for name in names:
            attention.use_backend(name)
            try:
                for _ in range(3):
                    step()
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - start)
                with torch.no_grad():
                    kernel = attention.kernel_that_runs(lambda: attention.attend(q, k, v, None))
                times.sort()
                timings[name] = {"ms": round(1000 * times[len(times) // 2], 3), "kernel": kernel}
            except RuntimeError as e:  # "No available kernel": the backend cannot run this input
                timings[name] = {"error": str(e).strip().splitlines()[0][:300]}
    finally:
        attention.use_backend("auto")
    return timings


def peak_flops_of(device: torch.device, given: float | None) -> float:
    if given:
        return given
    if device.type != "cuda":
        return CPU_NOMINAL_PEAK
    name = torch.cuda.get_device_name(device)
    peak = gpu_peak_flops(name)
    if peak is None:
        raise SystemExit(f"no dense bf16 peak known for {name!r}: pass --peak-flops")
    return peak


def attention_ops(step, device: torch.device) -> tuple[list[str], str]:
    """One profiled step: the names of the attention ops and kernels it ran (e.g. the flash
    kernel), and the SDPA kernel's forward aten op, as the trainer's provenance.json names it."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    ops = sorted({e.key for e in prof.key_averages() if ATTENTION_OP.search(e.key)})
    return ops, ", ".join(kernel_ops(prof.events())) or "none"


def first_validation(
    model: torch.nn.Module, micro_batch: int, seq_len: int, vocab_size: int, device: torch.device
) -> None:
    """The trainer's step-0 validation (lmpipe.eval.val_loss.score on one val batch of the
    training micro-batch, built as lmpipe.data.loader.val_batches builds it): its no-grad
    forwards run, and compile, before the first training step, as in the trainer, so the
    graphs timed here are the trainer's, and a later process sharing the compile caches
    (benchmarks/gpu_check: real_run) finds every graph it needs already built."""
    tokens = np.random.default_rng(0).integers(0, vocab_size, micro_batch * seq_len + 1)
    val = val_set(tokens, seq_len, [(0, micro_batch)], GPT2_EOT)
    val_loss.score(model, val, device, dist.group.WORLD)  # a group: no progress bar


def compile_counters() -> dict[str, int]:
    """This process's torch.compile figures: graphs Dynamo compiled, and Inductor's FX graph
    cache and AOTAutograd's cache hits and misses (a hit: a graph another process of the same
    cache directories built, e.g. an earlier part of benchmarks/gpu_check)."""
    from torch._dynamo.utils import counters

    wanted = {
        "unique_graphs": counters["stats"]["unique_graphs"],
        "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
        "autograd_cache_hit": counters["aot_autograd"]["autograd_cache_hit"],
        "autograd_cache_miss": counters["aot_autograd"]["autograd_cache_miss"],
    }
    return {k: int(v) for k, v in wanted.items()}


def measure(
    preset: str,
    micro_batch: int,
    device: torch.device,
    *,
    seq_len: int = 1024,
    warmup: int = 10,
    steps: int = 20,
    dtype: str = "bfloat16",
    compile: bool = True,
    peak_flops: float | None = None,
    profile: bool = True,
    loss_chunk_tokens: int = 0,
    recompute: str = "none",
    fp8: bool = False,
    compile_scope: str = "regions",
    compile_mode: str = "default",
    loss_kernel: str = "pytorch",
) -> dict:
    """Time `steps` training steps of `preset` at `micro_batch` x `seq_len` after `warmup` ones.

    Call once a process (see the module's docstring); the process group must exist."""
    T, cuda = seq_len, device.type == "cuda"
    config = PRESETS[preset]
    assert T <= config.block_size, f"--seq-len {T} > {preset}'s block_size {config.block_size}"
    peak = peak_flops_of(device, peak_flops)
    if cuda:  # as the trainer (lmpipe.train.loop.run)
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    fused = cuda  # the fused kernel is the GPU's
    tc = train_config(
        {
            "seq_len": T, "micro_batch": micro_batch, "batch_tokens": micro_batch * T,
            "max_steps": warmup + steps, "dtype": dtype, "compile": compile,
            "optimizer": {"name": "adamw", "lr": 6e-4, "fused": fused},
            "loss_chunk_tokens": loss_chunk_tokens, "activation_checkpointing": recompute,
            "fp8": fp8, "compile_scope": compile_scope, "compile_mode": compile_mode,
            "loss_kernel": loss_kernel,
        },
        "gpu_train",
    )  # fmt: skip
    problem = compile_problem(compile_mode, device.type)  # the trainer's own refusal (CUDA graphs)
    if problem:
        raise ValueError(problem)
    cuda_graphs = compile and compile_mode in CUDA_GRAPH_MODES
    # the trainer's own model: its padded head on a GPU, its loss, sharding, compile, recompute
    model, _ = training_model(config, tc, device)
    optimizer = build_optimizer(model, tc.optimizer)
    x = torch.randint(0, config.vocab_size, (micro_batch, T), device=device)
    y = torch.randint(0, config.vocab_size, (micro_batch, T), device=device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def step() -> None:
        if cuda_graphs:  # as the trainer: a new replay of the graphs each forward
            torch.compiler.cudagraph_mark_step_begin()
        _, loss = model(x, y)
        loss.backward()
        clip_grad_norm(model, 1.0)
        optimizer.step()
        if fp8:  # as the trainer: the float8 weights' scales in one all-reduce
            after_optimizer_step(model)
        optimizer.zero_grad(set_to_none=True)

    t0 = time.time()
    first_validation(model, micro_batch, T, config.vocab_size, device)
    sync()
    validation_s = time.time() - t0
    t0 = time.time()
    for _ in range(warmup):  # compilation happens here
        step()
    sync()
    warmup_s = time.time() - t0
    warmup_peak = torch.cuda.max_memory_allocated(device) if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)  # steady state only from here
    t0 = time.time()
    for _ in range(steps):
        step()
    sync()  # host sync: wait for the timed steps
    dt = (time.time() - t0) / steps
    tokens_per_s = micro_batch * T / dt
    flops_per_token = model.flops_per_token(T)
    result = {
        "preset": preset,
        "params": model.num_params(),
        "micro_batch": micro_batch,
        "seq_len": T,
        "warmup_steps": warmup,
        "timed_steps": steps,
        "validation_s": validation_s,  # the trainer's step-0 validation, compiled first
        "warmup_s": warmup_s,
        "compile_counters": compile_counters(),
        "ms_per_step": dt * 1000,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": flops_per_token,
        "peak_flops": peak,
        "mfu": flops_per_token * tokens_per_s / peak,
        "dtype": dtype,
        "compile": compile,
        "compile_scope": compile_scope,  # train.compile_scope, train.compile_mode
        "compile_mode": compile_mode,
        "compiled": list(model.compiled),  # what lmpipe.train.parallel compiled
        "fused_adamw": fused,
        "loss_chunk_tokens": loss_chunk_tokens,
        "loss_kernel": loss_kernel,  # train.loss_kernel: PyTorch's head and loss, or a fused one
        "fp8": fp8,  # train.fp8: the blocks' linears in torchao's float8 (emulated off CUDA)
        "activation_checkpointing": recompute,
        "padded_head": model.padded_head_matmul,
    }
    if cuda:
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
        result["warmup_peak_memory_gib"] = warmup_peak / 2**30
    else:  # the process's peak RSS (Linux: KiB)
        result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if profile:
        try:
            ops, kernel = attention_ops(step, device)
            result["attention_ops"] = ops
            result["attention_kernel"] = kernel  # as provenance.json's attention_kernel
            result["flash_attention_used"] = any("flash" in op.lower() for op in ops)
        except Exception as e:  # the profiler is a diagnosis, not the measurement
            result["attention_ops"] = f"profiler failed: {type(e).__name__}: {e}"
    return result


def in_subprocess(mb: int, args: argparse.Namespace) -> dict:
    """One micro-batch size in a fresh process (this script with that size alone)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--micro-batches", str(mb), "--json", str(path)]
        keys = ("preset", "seq_len", "warmup", "steps", "device", "dtype", "peak_flops")
        more = ("loss_chunk_tokens", "recompute", "compile_scope", "compile_mode", "loss_kernel")
        for key in (*keys, *more):
            value = getattr(args, key)
            if value is not None:
                cmd += [f"--{key.replace('_', '-')}", str(value)]
        cmd += ["--no-compile"] if args.no_compile else []
        cmd += ["--no-profile"] if args.no_profile else []
        proc = subprocess.run(cmd)
        if path.exists():
            return json.loads(path.read_text())["results"][0]
        return {"micro_batch": mb, "error": f"exited {proc.returncode} without a result"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="d12", choices=list(PRESETS))
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument(
        "--peak-flops", type=float, help="default: the GPU's dense bf16 peak (lmpipe.hardware)"
    )
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--compile-scope", default="regions", choices=COMPILE_SCOPES, help="train.compile_scope"
    )
    parser.add_argument(
        "--compile-mode", default="default", choices=COMPILE_MODES,
        help="train.compile_mode (reduce-overhead, max-autotune: CUDA graphs)",
    )  # fmt: skip
    parser.add_argument(
        "--loss-chunk-tokens", type=int, default=0, help="train.loss_chunk_tokens (0: plain head)"
    )
    parser.add_argument(
        "--recompute", default="none", choices=["none", "selective", "full"],
        help="train.activation_checkpointing",
    )  # fmt: skip
    parser.add_argument(
        "--fp8", action="store_true", help="train.fp8 (torchao float8; needs capability 8.9)"
    )
    parser.add_argument(
        "--loss-kernel", default="pytorch", choices=["pytorch", *LOSS_KERNELS],
        help="train.loss_kernel (a fused Triton head and loss: CUDA, its package installed)",
    )  # fmt: skip
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled step")
    parser.add_argument("--json", type=Path, help="write the results here (default: $OUT)")
    args = parser.parse_args(argv)

    if len(args.micro_batches) > 1:  # one size a process
        results = [in_subprocess(mb, args) for mb in args.micro_batches]
        info = {}
    else:
        (mb,) = args.micro_batches
        d = init_distributed(args.device)
        try:
            info = device_info(d.device)
            print(f"{info['device_name']}, torch {info['torch']}, CUDA {info['cuda']}", flush=True)
            problem = args.fp8 and fp8_problem(d.device, not args.no_compile)
            try:
                if problem:  # the trainer's own refusal (no torchao, a GPU without FP8)
                    raise ValueError(problem)
                r = measure(
                    args.preset, mb, d.device, seq_len=args.seq_len, warmup=args.warmup,
                    steps=args.steps, dtype=args.dtype, compile=not args.no_compile,
                    peak_flops=args.peak_flops, profile=not args.no_profile,
                    loss_chunk_tokens=args.loss_chunk_tokens, recompute=args.recompute,
                    fp8=args.fp8, compile_scope=args.compile_scope, compile_mode=args.compile_mode,
                    loss_kernel=args.loss_kernel,
                )  # fmt: skip
                results = [r | {"device_name": info["device_name"], "device_info": info}]
            except torch.OutOfMemoryError:
                results = [{"preset": args.preset, "micro_batch": mb, "error": "out of memory"}]
            except ValueError as e:
                results = [{"preset": args.preset, "micro_batch": mb, "error": str(e)}]
        finally:
            dist.destroy_process_group()
    for r in results:
        if "error" in r:
            print(f"micro-batch {r['micro_batch']:3d}: {r['error']}", flush=True)
            continue
        memory = r.get("peak_memory_gib", r.get("peak_rss_gib"))
        print(
            f"{r['preset']} micro-batch {r['micro_batch']:3d} x {r['seq_len']}:"
            f" {r['tokens_per_s']:,.0f} tokens/s, {r['ms_per_step']:.1f} ms/step,"
            f" MFU {100 * r['mfu']:.1f}% (peak {r['peak_flops']:.3g}),"
            f" peak memory {memory:.2f} GiB, flash: {r.get('flash_attention_used')}",
            flush=True,
        )
    out = args.json or (
        Path(os.environ["OUT"], "gpu_train.json") if os.environ.get("OUT") else None
    )
    if out is not None:
        out.write_text(json.dumps({"info": info, "results": results}, indent=1))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
