"""One call on a GPU machine: is the trainer ready for the cluster? Every part, timed, into $OUT.

    PYTHONUNBUFFERED=1 PYTHONPATH=workflow python3 benchmarks/gpu_check.py --out "$OUT"
    PYTHONUNBUFFERED=1 PYTHONPATH=workflow python3 benchmarks/gpu_check.py --out "$OUT" \
        --parts speed.d12_mb64_blocks speed.d12_mb64_model     # the on-request parts
    benchmarks/gpu_check --smoke --out /tmp/gpu_check      # every part, tiny, on the CPU (CI)

Parts, in the order they run (names as in the JSON):

- `env`: nvidia-smi, the GPU's name, free memory and dense bf16 peak (lmpipe.hardware), torch,
  CUDA, packages, a C compiler on PATH (Triton builds its launcher with one), CPU count, flash
  attention (the SDPA switch and a flash-only bf16 call), each train.attention_backend timed on
  the 124m micro-batch's attention (forward + backward, with the kernel it ran: which to choose
  on this GPU), and a tiny torch.compile on the device.
  (CUDA runs in subprocesses only: this process never holds a CUDA context, which a GPU in
  exclusive-process mode would hold against every later run.)
- `data`: the embedded FineWeb sample tokenized with lmpipe.data.tokenize into llm.c shards.
- `correctness.first_step`: a tiny GPT-2 (2 layers x 64, block 128, fp32, no compile) trained
  through the launcher (`python -m lmpipe.train`: torchrun, NCCL, 1 rank) and the same settings
  on the CPU (`python -m lmpipe.train.pretrain`, one process): the first train loss and the
  step-0 val loss agree within a stated relative tolerance (TF32 matmuls on the GPU).
- `correctness.resume`: the same run SIGKILLed (launcher, torchrun and worker) once its first
  checkpoint exists, then rerun: it resumes, and its final weights and every logged loss equal the
  uninterrupted run's bit for bit. If not, the largest differences are reported, and so is the
  run-to-run difference of a second uninterrupted run (the GPU's nondeterminism, if any).
- `correctness.convert`: `python -m lmpipe.models` on the final checkpoint; logits on the device
  of the checkpoint's model, of `lmpipe.models.load_hf` of the export (expected bitwise equal) and
  of transformers' GPT2LMHeadModel (fp32, stated tolerance); llm.c's file read back equal.
- `speed.<preset>_mb<B>`: benchmarks/gpu_train.py, one micro-batch size a process, the trainer's
  own model (its padded head, loss, FSDP2 on one rank, bf16, compile, fused AdamW): seq 1024;
  tokens/s, MFU, steady-state peak memory, attention kernels (and the SDPA kernel's aten op). The
  124m run's micro-batch (64), in bf16, compiled as the trainer compiles (train.compile_scope
  regions: the stem, each block and the tail, final norm -> LM head -> loss, as regions), then
  in FP8 (`_fp8`: train.fp8, torchao's float8; skipped where torchao is not installed), then the
  head and loss in chunks (`_chunked`: train.loss_chunk_tokens 8192).
- `real_run`: d12 (124M) at `speed.d12_mb64`'s micro-batch and settings, trained for 80 steps
  of 128K tokens on the tokenized sample (several epochs) through the launcher, bf16 + compile,
  every graph read back from the compile caches that part filled; the loss curve
  (loss_curve.csv, loss_curve.png when matplotlib imports), the tokens/s and MFU the trainer
  logged, and the graphs it compiled itself (expected none).
- on request (`--parts` names them; their budgets do not fit the deadline beside the others, and
  with env's and data's they fit a second call): the compile trials, the blocks only
  (`speed.d12_mb64_blocks`: the stem and final norm eager, the loss compiled alone), the whole
  model as one graph (`_model`), and the whole model in CUDA graphs (`_model_reduce-overhead`:
  train.compile_mode; skipped off CUDA). The last two are trials: their failure is their
  result, and later parts stay compiled.
  `--smoke` runs every part.

Each part runs in try/except with a time budget; gpu_check.json is rewritten after each part, so a
timeout still leaves results. A part whose estimate no longer fits `--deadline` is skipped. What a
part leaves of its budget goes to the next; a part that cannot run here gives all of it. Every
process of the call shares one Inductor and one Triton cache (under the scratch folder). The
default parts' budgets sum to under the default deadline (450 s), the most important parts
first; so do env's, data's and the on-request parts'.
Writes to --out: gpu_check.json, gpu_check.log (this script's lines and every subprocess's
output), loss_curve.csv and loss_curve.png. Imports nothing that the GPU image may lack
(snakemake, jsonschema, lm_eval, datasets).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / "workflow"
sys.path.insert(0, str(WORKFLOW))
from lmpipe.config import (  # noqa: E402
    ModelConfig,
    Placement,
    ScheduleConfig,
    TrainConfig,
    compile_problem,
    named_models,
)
from lmpipe.hardware import CPU_NOMINAL_PEAK, gpu_peak_flops  # noqa: E402
from lmpipe.provenance import package_versions  # noqa: E402
from lmpipe.registry import AdamWSettings  # noqa: E402

TOKENIZER = REPO / "resources" / "gpt2"
SAMPLE = REPO / "resources" / "fineweb_sample.parquet"
GPU_TRAIN = REPO / "benchmarks" / "gpu_train.py"
DEFAULT_DEADLINE = 450.0  # seconds: one device call, with time left to rerun it
H200_PEAK = 989e12  # if the GPU's name is not in lmpipe.hardware (the trainer needs a number)
PEAK_MAY_BE_NONE = type(None) in typing.get_args(typing.get_type_hints(Placement)["peak_flops"])

# Tolerances (stated in the JSON too)
FIRST_STEP_RTOL = {"cuda": 1e-3, "cpu": 1e-6}  # GPU: TF32 matmuls (the trainer's), fp32 otherwise
NATIVE_LOGITS_ATOL = 1e-5  # the export read back natively: same weights, same kernels (expect 0)
HF_LOGITS_ATOL, HF_LOGITS_RTOL = 1e-4, 1e-4  # transformers' GPT-2, fp32, TF32 off
# in a crashed compiled run's output: compilation failed (then an eager try, and no compile after)
COMPILE_ERRORS = ("torch._dynamo", "torch._inductor", "triton", "Triton", "BackendCompilerFailed")
PACKAGES = (
    "torch", "triton", "numpy", "transformers", "tokenizers", "tiktoken", "safetensors", "pyarrow",
    "tensorboard", "psutil", "tqdm", "pyyaml", "matplotlib",
)  # fmt: skip


class PartFailed(Exception):
    """A part ran but its check did not hold; `details` go into the JSON."""

    def __init__(self, message: str, details: dict | None = None):
        super().__init__(message)
        self.details = details or {}


class PartTimeout(Exception):
    """A part ran out of its budget (or of the deadline); `details` hold what it got."""

    def __init__(self, message: str, details: dict | None = None):
        super().__init__(message)
        self.details = details or {}


# ---- what each mode runs -----------------------------------------------------------------------


@dataclass(frozen=True)
class Speed:
    """A speed part: gpu_train.py's preset and micro-batch, train.loss_chunk_tokens (0: the
    plain head), train.fp8, train.compile_scope, train.compile_mode and train.loss_kernel."""

    preset: str
    mb: int
    chunk: int = 0
    fp8: bool = False
    scope: str = "regions"
    mode: str = "default"
    kernel: str = "pytorch"

    @property
    def name(self) -> str:
        name = speed_name(self.preset, self.mb, self.chunk, self.fp8, self.scope, self.mode)
        return name + ("" if self.kernel == "pytorch" else f"_{self.kernel}")

    @property
    def trial(self) -> bool:
        """A compile that may not run yet (the whole model, CUDA graphs): its failure is its
        result, never a reason to run the later parts eagerly."""
        return self.scope == "model" or self.mode != "default"


@dataclass
class Plan:
    device: str  # "cuda", or "cpu" for --smoke
    sample_docs: int | None  # documents of the sample to tokenize (None: all 1,000)
    val_shard_tokens: int
    tiny: ModelConfig
    tiny_train: TrainConfig
    kill_at: int  # the checkpoint step the interrupted run is killed at
    # in order of importance: the first size right after the correctness parts, the others
    # after real_run
    speed: list[Speed]
    speed_args: list[str]
    real_model: ModelConfig
    real_train: TrainConfig
    # part -> (estimate, budget) in seconds: skipped if the estimate does not fit the deadline;
    # its subprocesses are killed after the budget
    budgets: dict[str, tuple[float, float]] = field(default_factory=dict)
    # parts that run only when --parts names them: their budgets do not fit the deadline beside
    # the default parts' (a second call runs them)
    on_request: tuple[str, ...] = ()


def adamw(lr: float, fused: bool) -> AdamWSettings:
    return AdamWSettings(name="adamw", lr=lr, weight_decay=0.1, betas=(0.9, 0.95), fused=fused)


def plan_for(smoke: bool) -> Plan:
    tiny = ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=128)
    tiny_train = TrainConfig(
        seq_len=128,
        micro_batch=4,
        batch_tokens=1024,  # 2 micro-steps of 4 x 128: gradient accumulation too
        optimizer=adamw(1e-3, fused=False),  # the same optimizer code on both devices
        max_steps=8 if smoke else 16,
        schedule=ScheduleConfig(warmup_steps=2, lr_floor=0.1),
        val_every=4,
        val_tokens=2048,
        checkpoint_every=2,  # many saves after the kill point: the run cannot finish unseen
        keep_checkpoints=2,
        dtype="float32",
        compile=False,
    )
    if smoke:
        return Plan(
            device="cpu",
            sample_docs=150,
            val_shard_tokens=16384,
            tiny=tiny,
            tiny_train=tiny_train,
            kill_at=2,
            speed=[
                Speed("tiny", 2),
                Speed("tiny", 2, fp8=True),
                Speed("tiny", 2, chunk=64),
                Speed("tiny", 2, scope="blocks"),
                Speed("tiny", 2, scope="model"),
                Speed("tiny", 2, scope="model", mode="reduce-overhead"),  # skipped: CUDA graphs
                Speed("tiny", 4),
            ],
            speed_args=["--seq-len", "128", "--warmup", "2", "--steps", "2"]
            + ["--device", "cpu", "--dtype", "float32", "--no-compile"],
            # the first speed part's model and micro-batch (as on the GPU), fp32, not compiled
            real_model=named_models()["tiny"],
            real_train=dataclasses.replace(
                tiny_train,
                micro_batch=2,
                max_steps=10,
                val_every=5,
                checkpoint_every=0,
                keep_checkpoints=1,
            ),  # fmt: skip
            budgets={
                "env": (5, 180),
                "data": (5, 120),
                "correctness.first_step": (5, 300),
                "correctness.resume": (5, 400),
                "correctness.convert": (5, 240),
                "speed": (5, 180),
                "real_run": (5, 300),
            },
        )
    d12 = named_models()["d12"]  # gpu_train.py's preset: the same graphs, the same cache keys
    return Plan(
        device="cuda",
        sample_docs=None,
        val_shard_tokens=131072,
        tiny=tiny,
        tiny_train=tiny_train,
        kill_at=2,
        # the 124m run's micro-batch, bf16: compiled as the trainer compiles (the stem, blocks
        # and tail as regions), in FP8 (train.fp8), the head and loss in chunks of 8K tokens
        # (never the 64K x 50,304 logits); on request: the blocks only, the whole model, the
        # whole model in CUDA graphs
        speed=[
            Speed("d12", 64),
            Speed("d12", 64, fp8=True),
            Speed("d12", 64, chunk=8192),
            Speed("d12", 64, scope="blocks"),
            Speed("d12", 64, scope="model"),
            Speed("d12", 64, scope="model", mode="reduce-overhead"),
            Speed("d12", 64, kernel="liger"),  # train.loss_kernel's fused heads and losses
            Speed("d12", 64, kernel="cut_cross_entropy"),
        ],
        speed_args=["--seq-len", "1024", "--warmup", "10", "--steps", "20"]
        + ["--device", "cuda", "--dtype", "bfloat16"],
        real_model=d12,
        # at speed.d12_mb64's micro-batch and settings: its step-0 validation and training
        # graphs are the ones that part compiled, read back from the shared compile caches
        real_train=TrainConfig(
            seq_len=1024,
            micro_batch=64,
            batch_tokens=131072,  # 2 micro-steps: gradient accumulation, as a real run
            optimizer=adamw(6e-4, fused=True),
            max_steps=80,  # ~10.5M tokens: ~21 s at the goal's 500K tokens/s
            schedule=ScheduleConfig(warmup_steps=10, lr_floor=0.1),
            val_every=40,
            val_tokens=65536,
            checkpoint_every=0,  # (the last step is saved anyway)
            keep_checkpoints=1,
            dtype="bfloat16",
            compile=True,
        ),
        # the budgets sum to under the 450 s deadline (tests/test_gpu_check.py), so the check
        # ends inside it whatever happens; the estimates are what a part is skipped for. What a
        # part leaves of its budget, or a part that cannot run here (FP8 without torchao) all of
        # it, goes to the next part. Where each figure comes from: benchmarks/README.md
        budgets={
            "env": (20, 30),
            "data": (10, 15),
            "correctness.first_step": (35, 45),
            "correctness.resume": (45, 55),
            "correctness.convert": (20, 25),
            # the first compile of d12, cold: the step-0 validation's graphs, then training's
            "speed.d12_mb64": (85, 105),
            "speed.d12_mb64_fp8": (50, 55),  # FP8's own graphs: a cold compile again
            "speed.d12_mb64_chunked": (30, 40),  # the blocks from the cache, the chunked loss new
            "real_run": (50, 70),  # every graph from the cache; 80 steps of 128K tokens
            # on request (--parts speed.d12_mb64_blocks speed.d12_mb64_model): a second call,
            # with env (they need no data); a fresh machine's caches are cold, so each is
            # budgeted for a first compile of d12
            "speed.d12_mb64_blocks": (60, 90),  # the blocks and the loss, each alone
            # one graph of 12 blocks traced and scheduled whole
            "speed.d12_mb64_model": (70, 100),
            "speed.d12_mb64_model_reduce-overhead": (55, 80),  # the same, in CUDA graphs
            # the fused Triton head and loss (their wheels installed --no-deps first): the stem
            # and blocks compiled as regions (cold on a fresh machine), the kernel's autotuning
            "speed.d12_mb64_liger": (70, 100),
            "speed.d12_mb64_cut_cross_entropy": (70, 100),
        },
        on_request=(
            "speed.d12_mb64_blocks",
            "speed.d12_mb64_model",
            "speed.d12_mb64_model_reduce-overhead",
            "speed.d12_mb64_liger",
            "speed.d12_mb64_cut_cross_entropy",
        ),
    )


def speed_name(
    preset: str, mb: int, chunk: int = 0, fp8: bool = False, scope: str = "regions",
    mode: str = "default",
) -> str:  # fmt: skip
    """speed.d12_mb64, with _chunked, _fp8, _blocks or _model (train.compile_scope other than
    regions) and _<mode> (train.compile_mode other than default) as set."""
    name = f"speed.{preset}_mb{mb}" + ("_chunked" if chunk else "") + ("_fp8" if fp8 else "")
    name += "" if scope == "regions" else f"_{scope}"
    return name + ("" if mode == "default" else f"_{mode}")


def kernel_missing(kernel: str) -> str | None:
    """Why train.loss_kernel `kernel` cannot run here for want of its package, or None (its
    table imported here only: lmpipe.models.head_loss imports torch, which starts no CUDA)."""
    from lmpipe.models.head_loss import LOSS_KERNELS

    module, package = LOSS_KERNELS[kernel]
    found = importlib.util.find_spec(module) is not None
    return None if found else f"{package} not installed (pip install --no-deps its wheel)"


# ---- run in subprocesses (`--internal KIND`): CUDA never starts in the main process ------------


def device_probe(out: Path, smoke: bool) -> dict:
    """torch, CUDA, the GPU, flash attention; then a tiny torch.compile on the device (its
    Inductor + Triton + C compiler path). The result is written before the compile, too."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_train import attention_timings, device_info

    cuda = torch.cuda.is_available()
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": cuda,
    }
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        name = torch.cuda.get_device_name(device)
        free, total = torch.cuda.mem_get_info(device)
        peak = gpu_peak_flops(name)
        info |= {
            "device_count": torch.cuda.device_count(),
            "device_name": name,
            "capability": list(torch.cuda.get_device_capability(device)),
            "memory_free_gib": round(free / 2**30, 1),
            "memory_total_gib": round(total / 2**30, 1),
            "bf16_peak_flops": peak,
            "bf16_peak_note": None if peak else f"unknown to lmpipe.hardware: {H200_PEAK:g} used",
        }
    info["attention"] = device_info(device)
    # the SDPA backends on the 124m run's micro-batch (64 rows of 1,024, 12 heads of 64), bf16
    shape, dtype = (
        ((2, 2, 64, 16), torch.float32) if smoke else ((64, 12, 1024, 64), torch.bfloat16)
    )
    try:
        info["attention_timings"] = attention_timings(device, shape, dtype)
    except Exception as e:  # (a figure, not a gate: env goes on)
        info["attention_timings"] = {"error": f"{type(e).__name__}: {str(e)[-500:]}"}
    out.write_text(json.dumps(info))
    backend = "eager" if smoke else "inductor"  # the smoke run compiles nothing
    t = time.monotonic()
    try:
        f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + 1, backend=backend)
        y = f(torch.randn(4096, device=device))
        float(y.sum())  # host sync
        info["compile_probe"] = {"backend": backend, "ok": True}
    except Exception as e:
        info["compile_probe"] = {"backend": backend, "ok": False, "error": f"{type(e).__name__}:"
                                 f" {str(e)[-3000:]}"}  # fmt: skip
    info["compile_probe"]["seconds"] = round(time.monotonic() - t, 1)
    return info


def logits_check(out: Path, final: str, hf_dir: str, llmc: str, val_file: str, device: str) -> dict:
    """Logits on `device` of the final checkpoint's model, of load_hf of its export (expected
    bitwise equal) and of transformers' GPT2LMHeadModel (fp32); llm.c's file read back."""
    import torch
    from transformers import GPT2LMHeadModel

    from lmpipe.data.shards import read_shard
    from lmpipe.models import load_final_checkpoint, load_hf
    from lmpipe.models.gpt2 import read_llmc

    dev = torch.device(device)
    ours, _ = load_final_checkpoint(final)
    state = {k: v.detach().clone() for k, v in ours.state_dict().items()}
    T = ours.config.block_size
    tokens = read_shard(Path(val_file))[: 2 * T].astype("int64")
    idx = torch.from_numpy(tokens).view(2, T).to(dev)
    native = load_hf(hf_dir)
    theirs = GPT2LMHeadModel.from_pretrained(hf_dir, local_files_only=True).float().eval()
    with torch.no_grad():
        ours_logits = ours.to(dev)(idx)[0]
        native_logits = native.to(dev)(idx)[0]
        hf_logits = theirs.to(dev)(idx).logits.float()
    native_diff = (native_logits - ours_logits).abs().max().item()
    hf_diff = (hf_logits - ours_logits).abs()
    hf_excess = (hf_diff - HF_LOGITS_RTOL * ours_logits.abs()).max().item()
    # llm.c's file read back: every tensor equal (wte: the real rows; the padding is zeros)
    config, params = read_llmc(llmc)
    V = config.vocab_size
    llmc_unequal = []
    for name, t in params.items():
        if name == "transformer.wte.weight":
            same = torch.equal(t[:V], state[name][:V]) and not t[V:].any()
        else:
            same = torch.equal(t, state[name])
        if not same:
            llmc_unequal.append(name)
    problems = []
    if native_diff > NATIVE_LOGITS_ATOL:
        problems.append(f"load_hf logits differ by {native_diff:.3g} > {NATIVE_LOGITS_ATOL}")
    if hf_excess > HF_LOGITS_ATOL:
        problems.append(
            f"transformers' logits differ by {hf_diff.max().item():.3g}"
            f" > {HF_LOGITS_ATOL} + {HF_LOGITS_RTOL} |logit|"
        )
    if llmc_unequal:
        problems.append(f"llm.c file: {len(llmc_unequal)} tensors differ")
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "input": list(idx.shape),
        "logits_shape": list(ours_logits.shape),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "native_vs_checkpoint_max_abs_diff": native_diff,
        "native_bitwise": native_diff == 0.0,
        "hf_vs_checkpoint_max_abs_diff": hf_diff.max().item(),
        "hf_attn_implementation": getattr(theirs.config, "_attn_implementation", None),
        "llmc_tensors": len(params),
        "llmc_unequal": llmc_unequal,
        "logits_abs_max": ours_logits.abs().max().item(),
        "problems": problems,
    }


INTERNAL = {"device": device_probe, "logits": logits_check}


def internal_main(kind: str, args_json: str, out: Path) -> int:
    result = INTERNAL[kind](out, **json.loads(args_json))
    out.write_text(json.dumps(result, default=str))
    return 0


# ---- the check ---------------------------------------------------------------------------------


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a command started in its own session and every process under it (the launcher
    starts torchrun, and torchrun each worker, in a session of its own), and wait until all are
    gone. The deepest first: no process sees its parent die and acts on it (a torchrun whose
    launcher dies stops its workers with a checkpoint)."""
    import psutil

    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    for kid in reversed(kids):
        try:
            kid.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    psutil.wait_procs(kids, timeout=30)
    proc.wait()


def read_metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def show(cmd: list[str]) -> str:
    """A command line for the log: long arguments (the job JSON) elided."""
    return " ".join(a if len(a) <= 80 else f"<{len(a)} chars>" for a in cmd)


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), 1e-30)


class Check:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.smoke = args.smoke
        self.plan = plan_for(args.smoke)
        self.out = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.json_path = self.out / "gpu_check.json"
        self.log_path = self.out / "gpu_check.log"
        self.logf = open(self.log_path, "a")
        self.work = Path(args.work or tempfile.mkdtemp(prefix="gpu_check_"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.part_end = float("inf")
        # the call's schedule: the budgets of the parts run or given up so far (time a part
        # leaves goes to the next), in seconds from t0
        self.scheduled = 0.0
        # Inductor's and Triton's caches, one for every process of the call: a graph one part
        # compiled, a later part reads back (real_run: speed.d12_mb64's); a caller's own wins
        self.caches = self.work / "compile_cache"
        self.compile_ok = True  # set False when the compile probe or a compiled run fails
        self.state: dict[str, Any] = {}  # what parts hand on (the tokens, the reference run)
        self.report: dict[str, Any] = {
            "script": "benchmarks/gpu_check.py",
            "mode": "smoke" if self.smoke else "gpu",
            "started_utc": now_utc(),
            "deadline_s": args.deadline,
            "argv": sys.argv[1:],
            "work": str(self.work),
            "tolerances": {
                "first_step_rel": FIRST_STEP_RTOL[self.plan.device],
                "first_step_note": "relative, on the first logged train loss and the step-0 val"
                " loss; the GPU side runs fp32 with TF32 matmuls (the trainer's CUDA setting)",
                "resume": "bitwise (torch.equal on every final tensor, equal losses)",
                "native_logits_abs": NATIVE_LOGITS_ATOL,
                "hf_logits": {"abs": HF_LOGITS_ATOL, "rel": HF_LOGITS_RTOL, "dtype": "float32"},
            },
            "parts": {},
        }
        self.save()

    # ---- bookkeeping ----

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def log(self, message: str) -> None:
        line = f"[{datetime.now():%H:%M:%S} +{self.elapsed():6.1f}s] {message}"
        print(line, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    def save(self) -> None:
        self.report["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        os.replace(tmp, self.json_path)

    def selected(self, name: str) -> bool:
        if not self.args.parts:  # the default parts
            return name not in self.plan.on_request
        if name == "env":  # env: the context of any figure
            return True
        wanted = set(self.args.parts)
        if name == "data" and any(
            p.startswith(("correctness", "real_run")) for p in self.args.parts
        ):
            wanted.add("data")  # what those parts train on
        return any(name.startswith(p) for p in wanted)

    def budget(self, name: str) -> tuple[float, float]:
        b = self.plan.budgets
        return b.get(name) or b.get(name.split(".")[0]) or (10, 120)

    def part(self, name: str, fn: Callable[[], dict], skip_reason: str | None = None) -> None:
        estimate, budget = self.budget(name)
        left = self.args.deadline - self.elapsed()
        record: dict[str, Any] = {"started_s": round(self.elapsed(), 1)}
        selected = self.selected(name)
        if skip_reason is not None and selected:  # cannot run here: its time goes to the next
            self.scheduled += budget
        if skip_reason is None and not selected:
            skip_reason = "not in --parts"
            if not self.args.parts:
                skip_reason = "on request: name it in --parts (a second call)"
        if skip_reason is None and left < estimate:
            skip_reason = f"would exceed --deadline: needs ~{estimate:.0f} s, {left:.0f} s left"
        if skip_reason is not None:
            record |= {"status": "skipped", "reason": skip_reason, "seconds": 0.0}
            self.report["parts"][name] = record
            self.save()
            self.log(f"{name}: skipped ({skip_reason})")
            return
        self.scheduled += budget
        allowed = min(self.scheduled - self.elapsed(), left)
        record["allowed_s"] = round(allowed, 1)  # its budget and what earlier parts left
        self.part_end = time.monotonic() + allowed
        self.log(f"{name}: start (budget {budget:.0f} s, allowed {allowed:.0f} s)")
        t = time.monotonic()
        try:
            record |= {"status": "ok", "result": fn()}
        except PartTimeout as e:
            record |= {"status": "timeout", "error": str(e), "result": e.details}
        except PartFailed as e:
            record |= {"status": "failed", "error": str(e), "result": e.details}
        except Exception as e:  # any other failure of the part: recorded, the others go on
            tb = traceback.format_exc()
            record |= {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": tb}
            self.logf.write(tb)
        record["seconds"] = round(time.monotonic() - t, 1)
        self.part_end = float("inf")
        self.report["parts"][name] = record
        self.save()
        error = f": {record['error']}" if "error" in record else ""
        self.log(f"{name}: {record['status']} in {record['seconds']:.1f} s{error}")

    # ---- subprocesses ----

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(WORKFLOW) + (os.pathsep + path if path else "")
        env["PYTHONUNBUFFERED"] = "1"
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS (the resume check)
        for key in ("OUT", "LMPIPE_FRESH_START"):  # only this script writes to $OUT
            env.pop(key, None)
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(self.caches / "inductor"))
        env.setdefault("TRITON_CACHE_DIR", str(self.caches / "triton"))
        if self.smoke:
            env["OMP_NUM_THREADS"] = "1"  # CI's cores are shared; equal threads, equal sums
        env.update(extra)
        return env

    def time_left(self, what: str) -> float:
        left = self.part_end - time.monotonic()
        if left <= 0:
            raise PartTimeout(f"{what}: no time left in the part's budget")
        return left

    def run(
        self, what: str, cmd: list[str], env: dict[str, str] | None = None, check: bool = True
    ) -> tuple[int, str]:
        """Run a command to its end (its output streams into the log); (exit code, its output)."""
        self.log(f"  {what}: {show(cmd)}")
        start = self.log_path.stat().st_size
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env or self.env(),
            stdout=self.logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        rc = self.wait_or_kill(what, proc)
        with open(self.log_path, "rb") as f:
            f.seek(start)
            output = f.read().decode(errors="replace")
        self.log(f"  {what}: exit {rc}")
        if check and rc != 0:
            raise PartFailed(f"{what} exited {rc}", {"output_tail": output[-4000:]})
        return rc, output

    def wait_or_kill(self, what: str, proc: subprocess.Popen) -> int:
        """`proc`'s exit code; past the part's budget (or on any error) it and its children die."""
        try:
            return proc.wait(timeout=self.time_left(what))
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            raise PartTimeout(f"{what}: killed at the part's budget") from None
        except BaseException:
            kill_tree(proc)
            raise

    def start_background(self, what: str, cmd: list[str], env: dict[str, str]) -> tuple:
        log = self.work / "logs" / f"{what}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log(f"  {what} (in the background): {show(cmd)}")
        f = open(log, "w")
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        return what, proc, f, log

    def wait_background(self, bg: tuple) -> None:
        what, proc, f, log = bg
        try:
            rc = self.wait_or_kill(what, proc)
        finally:
            f.close()
            output = log.read_text(errors="replace")
            self.logf.write(f"---- {what} ----\n{output}---- end of {what} ----\n")
            self.logf.flush()
        self.log(f"  {what}: exit {rc}")
        if rc != 0:
            raise PartFailed(f"{what} exited {rc}", {"output_tail": output[-4000:]})

    def run_killed(self, what: str, cmd: list[str], env: dict[str, str], out: Path, step: int):
        """Start a training command and SIGKILL all of it the moment checkpoint `step` exists."""
        self.log(f"  {what}: {show(cmd)} (killed at checkpoint {step})")
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=self.logf, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group (torchrun, the workers: kill_tree)
        )  # fmt: skip
        checkpoint = out / "checkpoints" / f"step_{step:06d}"
        try:
            while not checkpoint.exists():
                if proc.poll() is not None:
                    raise PartFailed(f"{what} exited {proc.returncode} before checkpoint {step}")
                if time.monotonic() > self.part_end:
                    raise PartTimeout(f"{what}: no checkpoint {step} within the budget")
                time.sleep(0.005)
        finally:
            kill_tree(proc)
        self.log(f"  {what}: killed (SIGKILL) with checkpoint {step} present")
        if (out / "final").exists():
            raise PartFailed(f"{what}: the run finished before it was killed")

    def internal(self, what: str, kind: str, **kwargs: Any) -> dict:
        """Run one of this script's internal functions (INTERNAL) in a subprocess; its result."""
        path = self.work / f"internal_{kind}.json"
        path.unlink(missing_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--internal", kind]
        cmd += ["--internal-args", json.dumps(kwargs), "--internal-out", str(path)]
        rc, output = self.run(what, cmd, check=False)
        if not path.exists():
            raise PartFailed(
                f"{what} exited {rc} without a result", {"output_tail": output[-4000:]}
            )
        result = json.loads(path.read_text())
        if rc != 0:
            result["exit"] = rc
            result["output_tail"] = output[-4000:]
        return result

    # ---- the commands ----

    def placement(self, device: str) -> Placement:
        """One node, one rank. `peak_flops` None (the trainer looks the device's peak up in
        lmpipe.hardware) where the config allows it and the peak is known; else a number."""
        peak: float | None = CPU_NOMINAL_PEAK
        if device == "cuda":
            peak = self.state.get("peak_flops") or H200_PEAK
        if PEAK_MAY_BE_NONE and (device == "cpu" or self.state.get("peak_flops")):
            peak = None
        return Placement(device=device, nodes=1, procs_per_node=1, peak_flops=peak)

    @staticmethod
    def job_json(run: str, model: ModelConfig, train: TrainConfig, launch: Placement) -> str:
        """The trainer's JSON (lmpipe.config.TrainJob, as the train rule's params hold it)."""
        job = {
            "run": run,
            "dataset": "fineweb_sample",
            "model": dataclasses.asdict(model),
            "train": dataclasses.asdict(train),  # tuples become JSON lists
            "launch": dataclasses.asdict(launch),
        }
        return json.dumps(job)

    def train_cmd(self, job: str, out: Path, launcher: bool = True) -> list[str]:
        module = "lmpipe.train" if launcher else "lmpipe.train.pretrain"
        manifest = self.need("manifest", "data")
        args = ["--config-json", job, "--data", str(manifest), "--out", str(out)]
        return [sys.executable, "-m", module, *args]

    def need(self, key: str, part: str) -> Any:
        if key not in self.state:
            raise PartFailed(f"needs {key}, which the part {part!r} did not produce")
        return self.state[key]

    # ---- the parts ----

    def part_env(self) -> dict:
        import platform

        import psutil

        info: dict[str, Any] = {
            "time_utc": now_utc(),
            "host": socket.gethostname(),
            "python": platform.python_version(),
            "executable": sys.executable,
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "cpu_affinity": len(os.sched_getaffinity(0)),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "work_disk_free_gib": round(shutil.disk_usage(self.work).free / 2**30, 1),
            "c_compiler": {
                name: shutil.which(name) for name in ("cc", "gcc", "clang", "c++", "g++")
            }
            | {"CC": os.environ.get("CC")},
        }
        import sysconfig

        include = sysconfig.get_paths().get("include") or ""
        info["python_h"] = (Path(include) / "Python.h").exists()  # Triton's launcher needs it
        info["packages"] = package_versions(PACKAGES)
        if shutil.which("nvidia-smi"):
            try:
                smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
                info["nvidia_smi"] = smi.stdout + smi.stderr
            except (OSError, subprocess.TimeoutExpired) as e:
                info["nvidia_smi"] = f"nvidia-smi failed: {e}"
        else:
            info["nvidia_smi"] = "nvidia-smi not on PATH"
        self.log("  " + "\n  ".join(str(info["nvidia_smi"]).splitlines()[:12]))

        # CUDA only in subprocesses: this process never holds a CUDA context (a GPU in
        # exclusive-process mode would refuse every later run)
        probe = self.internal("device probe", "device", smoke=self.smoke)
        info |= probe
        self.state["peak_flops"] = probe.get("bf16_peak_flops")  # None: unknown, or no GPU
        compile_probe = info.get("compile_probe") or {}
        flash = info.get("attention", {}).get("flash_probe")
        self.log(
            f"  {info.get('device_name', 'no GPU')}, torch {info.get('torch')}, CUDA"
            f" {info.get('torch_cuda')}, flash probe {flash}, cc {info['c_compiler']['cc']},"
            f" Python.h {info['python_h']}, compile probe ok: {compile_probe.get('ok')}"
            f" ({compile_probe.get('seconds')} s)"
        )
        if not compile_probe.get("ok"):
            self.compile_ok = False
            self.report["compile_disabled"] = "the compile probe failed (see parts.env)"
        if not self.smoke and not info.get("cuda_available"):
            raise PartFailed("no CUDA device visible to torch", info)
        if not compile_probe.get("ok"):
            raise PartFailed("torch.compile failed on the device; compiled parts run eagerly", info)
        return info

    def part_data(self) -> dict:
        import pyarrow.parquet as pq

        from lmpipe.config import TokenizeConfig
        from lmpipe.data.tokenize import tokenize

        raw = self.work / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        table = pq.read_table(SAMPLE)
        if self.plan.sample_docs is not None:
            table = table.slice(0, self.plan.sample_docs)
        pq.write_table(table, raw / SAMPLE.name)
        raw_manifest = raw / "manifest.json"
        entry = {"file": SAMPLE.name, "rows": table.num_rows}
        raw_manifest.write_text(json.dumps({"files": [entry], "rows": table.num_rows}))
        cfg = TokenizeConfig(
            dataset="fineweb_sample", shard_tokens=4_000_000, val_tokens=self.plan.val_shard_tokens
        )
        t = time.monotonic()
        workers = max(1, min(8, len(os.sched_getaffinity(0))))
        manifest = tokenize(cfg, raw_manifest, str(TOKENIZER), self.work / "tokens", workers)
        seconds = time.monotonic() - t
        self.state["manifest"] = self.work / "tokens" / "manifest.json"
        self.state["train_tokens"] = manifest["tokens"]["train"]
        self.state["val_file"] = self.work / "tokens" / manifest["shards"][0]["file"]
        return {
            "documents": manifest["documents"],
            "shards": len(manifest["shards"]),
            "tokens": manifest["tokens"],
            "seconds": round(seconds, 2),
            "tokens_per_s": round(sum(manifest["tokens"].values()) / seconds),
        }

    def reference_run(self) -> Path:
        """The uninterrupted tiny run on the device (through the launcher), made once."""
        if "ref_out" in self.state:
            return self.state["ref_out"]
        out = self.work / "correctness" / "reference"
        job = self.job_json(
            "gpu-check-tiny", self.plan.tiny, self.plan.tiny_train, self.placement(self.plan.device)
        )
        self.run("reference run (launcher)", self.train_cmd(job, out))
        self.state["ref_out"] = out
        return out

    def part_first_step(self) -> dict:
        cpu_out = self.work / "correctness" / "cpu"
        cpu_job = self.job_json(
            "gpu-check-tiny", self.plan.tiny, self.plan.tiny_train, self.placement("cpu")
        )
        threads = "1" if self.smoke else str(max(1, min(8, len(os.sched_getaffinity(0)) // 2)))
        bg = self.start_background(
            "cpu run (one process)",
            self.train_cmd(cpu_job, cpu_out, launcher=False),
            self.env(OMP_NUM_THREADS=threads),
        )
        try:
            ref_out = self.reference_run()
        except BaseException:
            try:  # report the device run's failure, not the CPU run's
                self.wait_background(bg)
            except Exception:
                pass
            raise
        self.wait_background(bg)
        cpu_m, dev_m = read_metrics(cpu_out), read_metrics(ref_out)

        def first(ms: list[dict], key: str) -> float:
            return next(m[key] for m in ms if key in m)

        tol = FIRST_STEP_RTOL[self.plan.device]
        cpu_losses = [m["loss"] for m in cpu_m if "loss" in m]
        dev_losses = [m["loss"] for m in dev_m if "loss" in m]
        pairs = {
            "train_loss_step1": (first(cpu_m, "loss"), first(dev_m, "loss")),
            "val_loss_step0": (first(cpu_m, "val_loss"), first(dev_m, "val_loss")),
        }
        details: dict[str, Any] = {"tolerance_rel": tol, "device": self.plan.device}
        for key, (a, b) in pairs.items():
            details[key] = {"cpu": a, self.plan.device + "_launcher": b, "rel_diff": rel_diff(a, b)}
        details["losses_cpu"] = cpu_losses
        details["losses_device"] = dev_losses
        details["max_rel_diff_all_steps (info)"] = max(
            rel_diff(a, b) for a, b in zip(cpu_losses, dev_losses, strict=True)
        )
        bad = [k for k in pairs if details[k]["rel_diff"] > tol]
        if bad:
            raise PartFailed(f"{', '.join(bad)}: CPU and device differ by more than {tol}", details)
        return details

    def part_resume(self) -> dict:
        import torch

        from lmpipe.models import load_final_checkpoint

        ref_out = self.reference_run()
        out = self.work / "correctness" / "resumed"
        job = self.job_json(
            "gpu-check-tiny", self.plan.tiny, self.plan.tiny_train, self.placement(self.plan.device)
        )
        cmd = self.train_cmd(job, out)
        self.run_killed("interrupted run", cmd, self.env(), out, self.plan.kill_at)
        left = sorted(p.name for p in (out / "checkpoints").iterdir())
        _, output = self.run("resumed run", cmd)
        resumed = [ln.strip() for ln in output.splitlines() if "resumed from" in ln]
        details: dict[str, Any] = {
            "killed_at_checkpoint": self.plan.kill_at,
            "checkpoints_after_kill": left,
            "resumed_log_line": resumed[0][-160:] if resumed else None,
        }
        if not resumed:
            raise PartFailed("the rerun did not resume from a checkpoint", details)

        def by_step(ms: list[dict], key: str) -> dict[int, float]:
            return {m["step"]: m[key] for m in ms if key in m}

        def compare(a_out: Path, b_out: Path) -> dict:
            a_m, b_m = read_metrics(a_out), read_metrics(b_out)
            result: dict[str, Any] = {}
            for key in ("loss", "val_loss"):
                a, b = by_step(a_m, key), by_step(b_m, key)
                result[f"{key}_steps"] = [len(a), len(b)]
                result[f"{key}_equal"] = a == b
                common = set(a) & set(b)
                result[f"{key}_max_abs_diff"] = max((abs(a[s] - b[s]) for s in common), default=0)
            a_model, _ = load_final_checkpoint(a_out / "final")
            b_model, _ = load_final_checkpoint(b_out / "final")
            sa, sb = a_model.state_dict(), b_model.state_dict()
            unequal = [k for k in sa if not torch.equal(sa[k], sb[k])]
            result["tensors"] = len(sa)
            result["tensors_unequal"] = unequal
            result["weights_max_abs_diff"] = max((sa[k] - sb[k]).abs().max().item() for k in sa)
            result["bitwise"] = (
                not unequal and result["loss_equal"] and result["val_loss_equal"]
                and result["loss_steps"][0] == self.plan.tiny_train.max_steps
            )  # fmt: skip
            return result

        details["resumed_vs_uninterrupted"] = compare(ref_out, out)
        if details["resumed_vs_uninterrupted"]["bitwise"]:
            return details
        # not bitwise: how far apart are two uninterrupted runs (the device's nondeterminism)?
        try:
            again = self.work / "correctness" / "reference_again"
            self.run("second uninterrupted run", self.train_cmd(job, again))
            details["uninterrupted_vs_uninterrupted"] = compare(ref_out, again)
        except (PartTimeout, PartFailed) as e:
            details["uninterrupted_vs_uninterrupted"] = f"not measured: {e}"
        r = details["resumed_vs_uninterrupted"]
        raise PartFailed(
            f"resumed != uninterrupted: weights max |diff| {r['weights_max_abs_diff']:.3g}"
            f" ({len(r['tensors_unequal'])}/{r['tensors']} tensors), losses max |diff|"
            f" {r['loss_max_abs_diff']:.3g}",
            details,
        )

    def part_convert(self) -> dict:
        final = self.reference_run() / "final"
        hf_dir, llmc = self.work / "correctness" / "hf", self.work / "correctness" / "llmc.bin"
        self.run(
            "convert",
            [sys.executable, "-m", "lmpipe.models", "--checkpoint", str(final), "--tokenizer",
             str(TOKENIZER), "--hf-out", str(hf_dir), "--llmc-out", str(llmc)],
        )  # fmt: skip
        details = self.internal(
            "logits check", "logits", final=str(final), hf_dir=str(hf_dir), llmc=str(llmc),
            val_file=str(self.need("val_file", "data")), device=self.plan.device,
        )  # fmt: skip
        if details["problems"]:
            raise PartFailed("; ".join(details["problems"]), details)
        return details

    def part_speed(self, spec: Speed) -> dict:
        name, preset, mb = spec.name, spec.preset, spec.mb
        path = self.work / f"{name}.json"
        base = [sys.executable, str(GPU_TRAIN), "--preset", preset, "--micro-batches", str(mb)]
        base += self.plan.speed_args + ["--loss-chunk-tokens", str(spec.chunk), "--json", str(path)]
        base += ["--compile-scope", spec.scope, "--compile-mode", spec.mode]
        base += ["--fp8"] if spec.fp8 else []
        base += [] if spec.kernel == "pytorch" else ["--loss-kernel", spec.kernel]
        if self.plan.device == "cuda" and not self.state.get("peak_flops"):
            base += ["--peak-flops", str(H200_PEAK)]  # a GPU lmpipe.hardware does not know
        compiled = "--no-compile" not in base and self.compile_ok
        cmd = base + ([] if compiled or "--no-compile" in base else ["--no-compile"])
        rc, output = self.run(f"gpu_train {preset} micro-batch {mb}", cmd, check=False)
        if path.exists():
            r = json.loads(path.read_text())["results"][0]
            if "error" in r:
                raise PartFailed(r["error"], r)
            if not 0 < r["mfu"] <= 1:
                raise PartFailed(f"implausible MFU {r['mfu']:.4g}", r)
            return r
        failure = {"exit": rc, "output_tail": output[-4000:]}
        if not compiled or spec.trial or not any(word in output for word in COMPILE_ERRORS):
            raise PartFailed(f"gpu_train exited {rc} without a result", failure)
        # the compiled run crashed: is it compilation? One eager try, then later parts go eager
        self.compile_ok = False
        self.report["compile_disabled"] = f"{name} crashed compiled"
        path.unlink(missing_ok=True)
        rc, output = self.run(
            f"gpu_train {preset} micro-batch {mb}, eager", base + ["--no-compile"]
        )
        r = json.loads(path.read_text())["results"][0]
        raise PartFailed(
            f"the compiled run exited {rc} without a result; eager figures in result",
            r | {"compiled_failure": failure},
        )

    def part_real_run(self) -> dict:
        out = self.work / "real_run"
        compiled = self.plan.real_train.compile and self.compile_ok
        train = dataclasses.replace(self.plan.real_train, compile=compiled)
        job = self.job_json(
            "gpu-check-real", self.plan.real_model, train, self.placement(self.plan.device)
        )
        timed_out: PartTimeout | None = None
        cached = self.cached_graphs()
        t = time.monotonic()
        try:
            self.run("real run (launcher)", self.train_cmd(job, out))
        except PartTimeout as e:
            timed_out = e
        wall = time.monotonic() - t
        ms = read_metrics(out)
        steps = [m for m in ms if "loss" in m]
        vals = [m for m in ms if "val_loss" in m]
        self.write_curve(ms, train)
        settled = [m for m in steps if m["step"] > 10] or steps  # after compile and warm-up
        tokens = steps[-1]["tokens"] if steps else 0
        summary: dict[str, Any] = {
            "model": dataclasses.asdict(self.plan.real_model),
            "train": {k: v for k, v in dataclasses.asdict(train).items() if k != "optimizer"}
            | {"lr": train.optimizer.lr, "fused_adamw": train.optimizer.fused},
            "launcher_wall_s": round(wall, 1),
            "steps_done": len(steps),
            "tokens": tokens,
            "epochs": round(tokens / self.state["train_tokens"], 2) if tokens else 0,
            "first_loss": steps[0]["loss"] if steps else None,
            "last_loss": steps[-1]["loss"] if steps else None,
            "val_losses": [[m["step"], m["val_loss"]] for m in vals],
            "median_tokens_per_s": statistics.median(m["tokens_per_s"] for m in settled)
            if settled
            else None,
            "median_mfu": statistics.median(m["mfu"] for m in settled) if settled else None,
            "train_wall_s": steps[-1]["wall_s"] if steps else None,
            # the step-0 validation and step 1: its compile (or cache reads) included
            "first_step_wall_s": steps[0]["wall_s"] if steps else None,
            # graphs it compiled itself, not read from speed.d12_mb64's (expected: none)
            "graphs_compiled": {k: n - cached[k] for k, n in self.cached_graphs().items()},
            "final_written": (out / "final").exists(),
            "loss_curve": [[m["step"], round(m["loss"], 5)] for m in steps],
        }
        provenance = out / "provenance.json"
        if provenance.exists():
            summary["trainer_peak_flops"] = json.loads(provenance.read_text()).get("peak_flops")
        if timed_out is not None:
            raise PartTimeout(str(timed_out), summary)
        problems = []
        if not steps or not summary["final_written"]:
            problems.append("no steps or no final checkpoint")
        if steps and not all(0 < m["mfu"] <= 1 for m in steps):
            bad = next(m for m in steps if not 0 < m["mfu"] <= 1)
            problems.append(f"the trainer logged MFU {bad['mfu']:.4g} at step {bad['step']}")
        if len(vals) >= 2 and not vals[-1]["val_loss"] < vals[0]["val_loss"]:
            problems.append(
                f"val loss did not fall: {vals[0]['val_loss']} -> {vals[-1]['val_loss']}"
            )
        if problems:
            raise PartFailed("; ".join(problems), summary)
        return summary

    def write_curve(self, ms: list[dict], train: TrainConfig) -> None:
        rows = ["step,tokens,loss,val_loss,lr,grad_norm,tokens_per_s,mfu,wall_s"]
        for m in ms:
            cells = [m.get(k, "") for k in ("step", "tokens", "loss", "val_loss", "lr")]
            cells += [m.get(k, "") for k in ("grad_norm", "tokens_per_s", "mfu", "wall_s")]
            rows.append(",".join(str(c) for c in cells))
        (self.out / "loss_curve.csv").write_text("\n".join(rows) + "\n")
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            self.log("  matplotlib is not importable: loss_curve.csv only")
            return
        steps = [m for m in ms if "loss" in m]
        vals = [m for m in ms if "val_loss" in m]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([m["step"] for m in steps], [m["loss"] for m in steps], label="train loss")
        ax.plot([m["step"] for m in vals], [m["val_loss"] for m in vals], "o-", label="val loss")
        c = self.plan.real_model
        ax.set_title(
            f"{c.n_layer}x{c.n_embd} GPT-2, {train.batch_tokens:,} tokens a step,"
            f" {train.dtype}, compile={train.compile} ({self.plan.device})"
        )
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(self.out / "loss_curve.png", dpi=100)
        plt.close(fig)

    # ---- the whole check ----

    def main(self) -> int:
        self.log(f"gpu_check ({self.report['mode']}): out {self.out}, work {self.work}")
        self.part("env", self.part_env)
        self.part("data", self.part_data)
        self.part("correctness.first_step", self.part_first_step)
        self.part("correctness.resume", self.part_resume)
        self.part("correctness.convert", self.part_convert)
        first = self.plan.speed[0]  # the run's own size: its variants, in order
        for spec in self.plan.speed:
            if (spec.preset, spec.mb) == (first.preset, first.mb):
                self.speed_part(spec)
        self.part("real_run", self.part_real_run)  # before the other sizes: it matters more
        for spec in self.plan.speed:
            if (spec.preset, spec.mb) != (first.preset, first.mb):
                self.speed_part(spec)
        return self.finish()

    def cached_graphs(self) -> dict[str, int]:
        """Entries of the call's Inductor cache: FX graphs compiled (`fxgraph`) and AOTAutograd's
        forward/backward pairs (`aotautograd`), each one file."""
        root = Path(self.env()["TORCHINDUCTOR_CACHE_DIR"])
        kinds = ("fxgraph", "aotautograd")
        return {k: sum(f.is_file() for f in (root / k).rglob("*")) for k in kinds}

    def cache_figures(self) -> dict[str, Any]:
        """What the call's compile caches hold (files and MiB, Inductor's and Triton's), or the
        caller's directories where it set them."""
        figures: dict[str, Any] = {}
        env = self.env()
        for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            files = [f for f in Path(env[key]).rglob("*") if f.is_file()]
            size = sum(f.stat().st_size for f in files) / 2**20
            figures[key] = {"dir": env[key], "files": len(files), "mib": round(size, 1)}
        return figures

    def speed_part(self, spec: Speed) -> None:
        """One speed part; skipped, not failed, where it cannot run here: FP8 where torchao is
        not installed (the GPU image may lack it), a fused loss kernel where its package is not,
        CUDA graphs off CUDA (the trainer's line), a compile trial where torch.compile failed
        earlier."""
        reason = None
        if spec.fp8 and importlib.util.find_spec("torchao") is None:
            reason = "torchao not installed"
        elif (
            spec.kernel != "pytorch"
            and self.selected(spec.name)
            and (missing := kernel_missing(spec.kernel))
        ):
            reason = missing
        elif compile_problem(spec.mode, self.plan.device):
            reason = compile_problem(spec.mode, self.plan.device)
        elif spec.trial and not self.compile_ok:
            reason = "torch.compile failed earlier (compile_disabled): nothing to try"
        self.part(spec.name, partial(self.part_speed, spec), skip_reason=reason)

    def finish(self) -> int:
        parts = self.report["parts"]
        by_status: dict[str, list[str]] = {}
        for name, record in parts.items():
            by_status.setdefault(record["status"], []).append(name)
        speed = []
        for name, record in parts.items():
            r = record.get("result") or {}
            if name.startswith("speed.") and "tokens_per_s" in r:
                memory = r.get("peak_memory_gib", r.get("peak_rss_gib"))
                speed.append(
                    {
                        "part": name,
                        "tokens_per_s": round(r["tokens_per_s"]),
                        "mfu": round(r["mfu"], 4),
                        "peak_memory_gib": round(memory, 2),
                        "compile": r["compile"],
                        "compile_scope": r.get("compile_scope"),
                        "compile_mode": r.get("compile_mode"),
                        "fp8": r.get("fp8", False),
                        "attention_kernel": r.get("attention_kernel"),
                        "flash": r.get("flash_attention_used"),
                        # compile time, and what the shared caches held for it
                        "validation_s": r.get("validation_s"),
                        "warmup_s": r.get("warmup_s"),
                        "compile_counters": r.get("compile_counters"),
                        "status": record["status"],
                    }
                )
        self.report["summary"] = {
            "by_status": by_status, "speed": speed, "compile_cache": self.cache_figures(),
        }  # fmt: skip
        self.report["finished_utc"] = now_utc()
        self.save()
        self.log("summary: " + ", ".join(f"{k} {len(v)}" for k, v in by_status.items()))
        for name, record in parts.items():
            self.log(f"  {record['status']:8s} {name}: {record.get('error', '')}")
        for s in speed:
            self.log(
                f"  {s['part']}: {s['tokens_per_s']:,} tokens/s, MFU {100 * s['mfu']:.1f}%,"
                f" peak {s['peak_memory_gib']} GiB, compile {s['compile']} ({s['compile_scope']},"
                f" {s['compile_mode']}), attention {s['attention_kernel']}"
            )
        self.logf.close()
        cap = 15 * 2**20  # what comes back from the device is capped at 16 MB a file
        if self.log_path.stat().st_size > cap:
            data = self.log_path.read_bytes()
            cut = b"\n[... log cut to fit 15 MB ...]\n"
            self.log_path.write_bytes(data[: 2 * 2**20] + cut + data[-(cap - 2 * 2**20 - 64) :])
        if not self.args.keep_work:
            shutil.rmtree(self.work, ignore_errors=True)
        return 0 if set(by_status) <= {"ok", "skipped"} else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="default: $OUT")
    parser.add_argument("--smoke", action="store_true", help="every part, tiny, on the CPU")
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_DEADLINE,
        help="seconds; parts that would pass it are skipped",
    )
    parser.add_argument("--parts", nargs="+", help="only these parts (or prefixes: speed, ...)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new temp folder)")
    parser.add_argument("--keep-work", action="store_true", help="keep the scratch folder")
    parser.add_argument("--internal", choices=list(INTERNAL), help=argparse.SUPPRESS)
    parser.add_argument("--internal-args", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--internal-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.internal:
        return internal_main(args.internal, args.internal_args, args.internal_out)
    if args.out is None:
        parser.error("--out (or $OUT) is required")
    sys.stdout.reconfigure(line_buffering=True)
    return Check(args).main()


if __name__ == "__main__":
    sys.exit(main())
