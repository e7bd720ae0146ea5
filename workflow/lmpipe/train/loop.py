"""The training loop, the same for every kind of training: what differs comes in as a `Task`.

A worker (`torchrun -m lmpipe.train.pretrain`, or `lmpipe.chat.finetune`) builds its Task (the
loaders, the steps and schedule, the starting weights, which targets count) and calls `run`.
The loop is llm.c's / nanoGPT's: gradient accumulation to `batch_tokens` (the gradients reduced
over the ranks once a step), the optimizer of `train.optimizer` with the schedule's lr, gradient
clipping, validation every `val_every` steps, the evaluations during training it is handed, each
when it says it is due (the loop names none: lmpipe.train.evaluators), a DCP checkpoint every
`checkpoint_every` steps. A NaN/inf loss stops
the run with an error; SIGUSR1, SIGTERM or SIGINT (Ctrl-C) save a checkpoint at the end of the
step and exit with EXIT_STOPPED, for a retry to resume.

Writes under --out: `metrics.jsonl`, `attempts.jsonl` (each start and end: lmpipe.train.attempts),
`tb/`, `provenance.json`, `checkpoints/step_NNNNNN/` (resumed automatically) and `final/` (the
contract with `convert`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lmpipe import provenance
from lmpipe.config import (
    CUDA_GRAPH_MODES,
    ModelConfig,
    TrainConfig,
    TrainJob,
    WandbConfig,
    build,
    compile_problem,
    model_settings,
    settings_hash,
    without_added_keys,
)
from lmpipe.data.loader import Loader, ValSet
from lmpipe.data.prefetch import Prefetcher
from lmpipe.eval import val_loss
from lmpipe.failures import EXIT_STOPPED, stop_line
from lmpipe.hardware import CPU_NOMINAL_PEAK, gpu_peak_flops, keep_freed_memory
from lmpipe.job_params import PREFIX
from lmpipe.models import attention, build_model
from lmpipe.models.head_loss import loss_function
from lmpipe.train import fp8
from lmpipe.train.attempts import AttemptLog, short_error
from lmpipe.train.checkpoint import Checkpointer, save_final
from lmpipe.train.evaluators import Evaluator, build_evaluators
from lmpipe.train.metrics import Metrics, WandbRun
from lmpipe.train.optim import build_optimizer, clip_grad_norm, lr_at
from lmpipe.train.parallel import (
    Dist,
    die_with_parent,
    init_distributed,
    local_numel,
    loss_compiled_alone,
    parallelize,
    sync_gradients,
)
from lmpipe.train.wandb_log import run_config as wandb_config

log = logging.getLogger("lmpipe.train")

# each stops the run after the step and a checkpoint, with EXIT_STOPPED: a retry resumes
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
# train settings that never change the trajectory (logging, evaluation and checkpointing only;
# the evaluations during training are the job's `during_training`, never hashed either)
NOT_TRAJECTORY = (
    "val_every", "val_tokens", "checkpoint_every", "keep_checkpoints", "checkpoint_async",
)  # fmt: skip


@dataclass
class Task:
    """What a kind of training brings to the loop; the loop knows nothing else of it."""

    train: TrainConfig  # the run's settings, max_steps and schedule resolved
    loader: Loader
    val: ValSet  # this rank's share of the validation data, with each target's document
    data_identity: Any  # what the data adds to the settings hash (e.g. the shards' sha256)
    # copies the starting weights into the freshly built, unsharded model and returns their
    # identity (hashed too, so another base's checkpoints are never resumed); None: random init
    init: Callable[[torch.nn.Module], str] | None = None
    sparse_targets: bool = False  # most targets are -1: the LM head runs on counted ones only
    meta: dict[str, Any] = field(default_factory=dict)  # extra keys for final/meta.json


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training cannot continue from this state."""


class StopFlag:
    """Set by SIGUSR1, SIGTERM or SIGINT; the loop acts on it at the next step boundary, on all
    ranks."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal = signum

    @property
    def name(self) -> str | None:
        """The signal's name ("SIGUSR1"), for the attempt's record."""
        return None if self.signal is None else signal.Signals(self.signal).name


def trajectory_hash(job: TrainJob, task: Task, world_size: int) -> str:
    """Hash of what shapes the trajectory: model, train settings, data, ranks (not logging)."""
    # a key added since runs were trained counts only away from the value that behaves as before
    settings = without_added_keys(dataclasses.asdict(task.train))
    train = {k: v for k, v in settings.items() if k not in NOT_TRAJECTORY}
    return settings_hash(
        {
            "model": model_settings(job.model),
            "train": train,
            "dataset": job.dataset,
            "data": task.data_identity,
            "world_size": world_size,
        }
    )


def peak_flops(job: TrainJob, device: torch.device) -> float:
    """A device's peak FLOP/s for MFU: `launch.peak_flops` if set, else the GPU found (dense
    bf16, lmpipe.hardware), else a nominal 1e12 on the CPU."""
    if job.launch.peak_flops is not None:
        return job.launch.peak_flops
    if device.type != "cuda":
        return CPU_NOMINAL_PEAK
    name = torch.cuda.get_device_name(device)
    peak = gpu_peak_flops(name)
    if peak is None:
        raise ValueError(
            f"runs.{job.run}.launch.peak_flops: no known peak for GPU {name!r}; set the dense"
            " bf16 FLOP/s of one device (lmpipe/hardware.py lists the known ones)"
        )
    return peak


def check_compiler(job: TrainJob) -> None:
    """torch.compile on a GPU builds Triton kernels, and Triton compiles a small launcher with
    the host C compiler the first time: without one the run would fail at step 1, after the
    model and data are loaded. Fail now, saying what to do."""
    if not job.train.compile or job.launch.device != "cuda":
        return
    candidates = [os.environ.get("CC"), "cc", "gcc", "clang"]
    if not any(c and shutil.which(c) for c in candidates):
        raise RuntimeError(
            f"runs.{job.run}.train.compile is true, but no C compiler is on PATH (CC, cc, gcc,"
            " clang): Triton needs one to build its kernels' launcher. Load one (e.g. `module"
            " load gcc`, or envs/train.yaml's gcc under --use-conda) or set compile: false."
        )


def check_attention(job: TrainJob) -> None:
    """train.attention_backend refused in one line, before the model is built, where the device
    has no such kernel (cudnn or efficient on the CPU)."""
    problem = attention.backend_problem(
        job.train.attention_backend, torch.device(job.launch.device)
    )
    if problem is not None:
        raise RuntimeError(f"runs.{job.run}: {problem}")


def check_compile(job: TrainJob) -> None:
    """train.compile_mode refused in one line where it cannot run (CUDA graphs off CUDA),
    before the model is built."""
    problem = compile_problem(job.train.compile_mode, job.launch.device)
    if problem is not None:
        raise RuntimeError(f"runs.{job.run}: {problem}")


def check_fp8(job: TrainJob) -> None:
    """train.fp8 refused in one line where it cannot run (no torchao, a GPU without FP8, the
    CPU's emulation under compile), before the model is built; on the CPU, said to emulate."""
    if not job.train.fp8:
        return
    device = torch.device(job.launch.device)
    problem = fp8.fp8_problem(device, job.train.compile)
    if problem is not None:
        raise RuntimeError(f"runs.{job.run}: {problem}")
    if fp8.emulated(device):
        print(
            f"runs.{job.run}: train.fp8 on the {device.type}: torchao's float8 emulation (FP8"
            " numerics, high-precision GEMMs), for tests; no speed-up",
            flush=True,
        )


def training_model(
    config: ModelConfig,
    tc: TrainConfig,
    device: torch.device,
    mesh: Any = None,
    sparse_targets: bool = False,
    init: Callable[[torch.nn.Module], str] | None = None,
) -> tuple[torch.nn.Module, str | None]:
    """The model as the trainer trains it, and its starting weights' identity (None: random):
    seeded (every rank the same full weights before sharding), the head and loss as the device
    and settings want (the padded head's aligned GEMMs on a GPU, as llm.c; the chunked loss),
    sharded, compiled (train.compile_scope, compile_mode) and recomputed as set.
    benchmarks/gpu_train.py measures this model."""
    torch.manual_seed(tc.seed)
    model = build_model(config)
    model.head_on_counted_only = sparse_targets
    model.padded_head_matmul = device.type == "cuda"
    identity = init(model) if init is not None else None
    alone = loss_compiled_alone(model, tc.compile, tc.compile_scope, tc.loss_chunk_tokens)
    model.loss_fn = loss_function(tc.loss_chunk_tokens, alone, tc.loss_kernel, device.type)
    attention.use_backend(tc.attention_backend)  # every attend of this process
    if tc.fp8:  # before sharding: FSDP2 all-gathers float8 weights
        world = mesh.size() if mesh is not None else dist.get_world_size()
        fp8.convert_blocks(model, device, fsdp=tc.fsdp.sharded(world))
    model = parallelize(
        model, device, tc.dtype, tc.compile, tc.fsdp, mesh, tc.activation_checkpointing,
        tc.compile_scope, tc.compile_mode, tc.embedding_dtype,
    )  # fmt: skip
    return model, identity


def accumulate_gradients(
    model: torch.nn.Module,
    next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    accum: int,
    device: torch.device,
    reduce_each_micro_step: bool = False,
    sparse_targets: bool = False,
    cuda_graphs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's gradients, of the mean loss over `accum` micro-batches (`next_batch`'s), one
    backward each; the step's loss (this rank's, detached) and, for `sparse_targets`, the targets
    the head ran on. The gradients are reduced over the ranks once, in the last micro-step's
    backward (sync_gradients), or in each where `reduce_each_micro_step` (fsdp's setting)."""
    loss_accum = torch.zeros((), device=device)
    counted = torch.zeros((), device=device)  # sparse targets: tokens the head ran on
    for micro in range(accum):
        sync_gradients(model, reduce_each_micro_step or micro == accum - 1)
        x, y = next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if cuda_graphs:  # a new replay of the graphs: the last one's outputs are done
            torch.compiler.cudagraph_mark_step_begin()
        _, loss = model(x, y)
        loss = loss / accum  # the gradient of the mean over the whole step
        loss_accum += loss.detach()
        if sparse_targets:
            counted += (y != -1).sum()  # -1: the model's "does not count" target
        loss.backward()  # synced: FSDP reduce-scatters each unit's gradients (the ranks' mean)
    return loss_accum, counted


def attention_kernel(model: torch.nn.Module, seq_len: int, device: torch.device) -> str:
    """The attention kernel the model runs (lmpipe.models.attention.kernel_that_runs), from one
    profiled forward of a (1, min(seq_len, 1024)) batch: no gradients, eager (that shape never
    reaches a compiled graph; and eager FlexAttention holds all the scores: 51 GB or more at a
    65,536-token row), on every rank (FSDP gathers the weights)."""
    idx = torch.zeros((1, min(seq_len, 1024)), dtype=torch.long, device=device)
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        return attention.kernel_that_runs(lambda: model(idx))


def write_provenance(
    job: TrainJob,
    model: torch.nn.Module,
    d: Dist,
    digest: str,
    peak: float,
    out: Path,
    seq_len: int,
) -> None:
    """provenance.json: code, packages, hosts, how the parameters are spread over the ranks, and
    the attention kernel that runs (a profiled forward, after the parameters are counted: FSDP
    leaves the root's gathered after a forward until the next backward)."""
    hosts, held = [None] * d.world_size, [None] * d.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    # each rank's SLURM node name (None outside SLURM): test slurmds on one machine share a host
    slurm_nodes = [None] * d.world_size
    dist.all_gather_object(slurm_nodes, os.environ.get("SLURMD_NODENAME"))
    dist.all_gather_object(held, local_numel(model))  # parameter elements each rank holds
    kernel = attention_kernel(model, seq_len, d.device)
    if d.is_main:
        prov = (
            provenance.collect()
            | {
                "world_size": d.world_size,
                "device": d.device.type,
                "nodes": job.launch.nodes,
                "settings_hash": digest,
                "hosts": hosts,
                "slurm_nodes": slurm_nodes,
                "params": model.num_params(),
                "params_per_rank": held,
                "peak_flops": peak,  # a device's, for the MFU figures
                # what the model trains with, read off the model (lmpipe.models.head_loss,
                # lmpipe.train.parallel.recompute_blocks)
                "loss_chunk_tokens": getattr(model.loss_fn, "chunk_tokens", 0),
                "loss_kernel": getattr(model.loss_fn, "kernel", "pytorch"),
                "recompute": [getattr(b.forward, "recompute", "none") for b in model.blocks()],
                "attention_backend": job.train.attention_backend,  # the setting
                "attention_kernel": kernel,  # the SDPA kernel that ran (attention_kernel)
                "compiled": list(getattr(model, "compiled", ())),  # lmpipe.train.parallel
            }
            | fp8.describe(model, d.device)
        )
        (out / "provenance.json").write_text(json.dumps(prov, indent=1))


@dataclass
class Progress:
    """Where the run is, saved in each checkpoint beside the model and optimizer: the step, the
    tokens, the wall time before this attempt, and the seconds each evaluation during training
    took (`eval_s`: all of them; each evaluation's by name)."""

    step: int = 0
    tokens: int = 0
    wall_before: float = 0.0
    eval_s: float = 0.0
    evals_s: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def wall_s(self) -> float:
        return self.wall_before + time.time() - self.started

    def state(self, loader: Prefetcher) -> dict[str, Any]:
        """The train_state a checkpoint saves."""
        return {
            "tokens": self.tokens, "loader": loader.state_dict(), "wall_s": self.wall_s(),
            "eval_s": self.eval_s, "evals_s": self.evals_s,
        }  # fmt: skip

    def resume(self, state: dict[str, Any]) -> None:
        self.step, self.tokens, self.wall_before = state["step"], state["tokens"], state["wall_s"]
        self.eval_s = state.get("eval_s", 0.0)  # seconds of the evals during training
        self.evals_s = dict(state.get("evals_s", {}))  # by evaluation (absent in older ones)


class Trainer:
    """One attempt at a run's training: the model, its optimizer, data and logs, and the steps,
    validations, evaluations and checkpoints `run` calls in turn."""

    def __init__(
        self, job: TrainJob, task: Task, out: Path, d: Dist, evaluators: list[Evaluator]
    ) -> None:
        tc = self.tc = task.train
        self.job, self.task, self.out, self.d, self.evaluators = job, task, out, d, evaluators
        self.accum = tc.grad_accum_steps(d.world_size)
        self.digest = trajectory_hash(job, task, d.world_size)
        self.peak = peak_flops(job, d.device)  # a device's FLOP/s, for MFU
        if d.device.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 matmuls
            torch.backends.cudnn.allow_tf32 = True
        self.model = self.build_model()
        self.cuda_graphs = tc.compile and tc.compile_mode in CUDA_GRAPH_MODES
        self.flops_per_token = self.model.flops_per_token(tc.seq_len)
        self.head_flops_per_token = self.model.head_flops_per_token()
        self.optimizer = build_optimizer(self.model, tc.optimizer)
        self.peak_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.progress = Progress()
        self.attempt = AttemptLog(out, d.is_main)
        # batches are read ahead on a thread (pinned for the GPU: asynchronous copies); its
        # position stays the loop's own, so checkpoints resume exactly
        self.loader = Prefetcher(task.loader, pin=d.device.type == "cuda")

    def build_model(self) -> torch.nn.Module:
        """The model, sharded; a task's starting weights are hashed into the settings."""
        model, init = training_model(
            self.job.model, self.tc, self.d.device, self.d.mesh, self.task.sparse_targets,
            self.task.init,
        )  # fmt: skip
        if init is not None:  # e.g. fine-tuning: other bases' checkpoints never resume
            self.digest = settings_hash([self.digest, init])
        return model

    def start(self, fresh_start: bool, wandb: WandbConfig | None) -> None:
        """Resume from the newest checkpoint of these settings, if any; open the logs."""
        tc, d = self.tc, self.d
        self.ckpt = Checkpointer(
            self.out / "checkpoints", self.digest, tc.checkpoint_every, tc.keep_checkpoints,
            asynchronous=tc.checkpoint_async,
        )  # fmt: skip
        if fresh_start:
            self.ckpt.retire_all()
        resume = self.ckpt.find_resume()
        if resume is not None:
            state = self.ckpt.load(resume, self.model, self.optimizer)
            self.loader.load_state_dict(state["loader"])
            self.progress.resume(state)
            log.info("resumed from %s (step %d, %d tokens)", resume, state["step"], state["tokens"])
        w = (
            WandbRun(wandb, self.job.run, self.digest, wandb_config(self.job, tc))
            if wandb
            else None
        )
        self.metrics = Metrics(self.out, self.progress.step, d.is_main, w)
        self.attempt.start(self.progress.step, resume, d.world_size, self.digest, fresh_start)
        self.set_progress()  # (a modern model's attention window: the step's)
        write_provenance(self.job, self.model, d, self.digest, self.peak, self.out, tc.seq_len)
        if d.is_main:
            log.info(
                "%s: %d parameters, %d ranks x %d micro-batches x %d x %d = %d tokens a step;"
                " MFU against %.3g FLOP/s a device",
                self.job.run, self.model.num_params(), d.world_size, self.accum, tc.micro_batch,
                tc.seq_len, tc.batch_tokens, self.peak,
            )  # fmt: skip
        self.progress.started = time.time()

    def say(self, text: str) -> None:
        """A line of the log on rank 0, after the step: llm.c's format."""
        if self.d.is_main:
            print(f"step {self.progress.step:5d}/{self.tc.max_steps} | {text}", flush=True)

    def write(self, record: dict[str, Any]) -> None:
        """A metrics line at the current step: `record` between step, tokens and wall_s."""
        p = self.progress
        self.metrics.write({"step": p.step, "tokens": p.tokens} | record | {"wall_s": p.wall_s()})

    def set_progress(self) -> None:
        """The model's training progress, step / max_steps, where it reads one (a modern model's
        growing attention window): before each step and each validation, as the records set
        their window before both."""
        if hasattr(self.model, "progress"):
            self.model.progress = self.progress.step / max(self.tc.max_steps, 1)

    def validate(self) -> None:
        """The val loss (lmpipe.eval.val_loss.score, the evaluation's own scoring), with each
        document's summed loss and tokens: the report compares runs at equal tokens on them;
        where the val data has a byte table, the bytes scored and bits per byte too (runs of
        different tokenizers compare on it; conversations have none)."""
        self.set_progress()
        s = val_loss.score(self.model, self.task.val, self.d.device, self.d.group)
        documents = {"losses": [round(x, 6) for x in s.doc_losses], "tokens": s.doc_tokens}
        line: dict[str, Any] = {"val_loss": s.loss}
        if s.bytes:
            documents["bytes"] = s.doc_bytes
            line |= {"val_bytes": s.bytes, "val_bpb": s.bits_per_byte}
        self.write(line | {"val_documents": documents})
        bpb = f", {s.bits_per_byte:.4f} bits per byte" if s.bytes else ""
        self.say(f"val loss {s.loss:.4f}{bpb}")

    def evaluate(self) -> None:
        """The evaluators due at this step, each a metrics line; their cost printed as a share
        of the wall time so far."""
        p, took = self.progress, {}
        for evaluator in self.evaluators:
            if not evaluator.due(p.step, self.tc.max_steps):
                continue
            t0 = time.time()
            # eager: the evaluations' shapes (their own rows and lengths) must never reach the
            # compiled blocks, whose training graph would turn dynamic on a second shape
            with torch.compiler.set_stance("force_eager"):
                scores = evaluator(self.model, p.step)
            took[evaluator.name] = time.time() - t0
            self.write(scores.fields | {"eval_s": took[evaluator.name]})
            for line in scores.lines:
                self.say(line)
        if not took:
            return
        for name, seconds in took.items():
            p.eval_s += seconds
            p.evals_s[name] = p.evals_s.get(name, 0.0) + seconds
        now = " + ".join(f"{name} {s:.2f} s" for name, s in took.items())
        each = ", ".join(f"{name} {s:.1f} s" for name, s in p.evals_s.items())
        self.say(
            f"evals {now}; all evals {p.eval_s:.1f} s ({each})"
            f" = {p.eval_s / p.wall_s():.1%} of the wall time so far"
        )

    def train_step(self, stop: StopFlag) -> bool:
        """One optimizer step (gradient accumulation to batch_tokens), logged; whether any rank
        got a signal."""
        tc, d, p = self.tc, self.d, self.progress
        t0 = time.time()
        for group, peak_lr in zip(self.optimizer.param_groups, self.peak_lrs, strict=True):
            group["lr"] = lr_at(p.step, peak_lr, tc.schedule, tc.max_steps)
        self.set_progress()
        loss_accum, counted = accumulate_gradients(
            self.model, self.loader.next_batch, self.accum, d.device,
            tc.fsdp.reduce_each_micro_step, self.task.sparse_targets, self.cuda_graphs,
        )  # fmt: skip
        grad_norm = clip_grad_norm(self.model, tc.grad_clip)
        self.optimizer.step()
        if tc.fp8:
            fp8.after_optimizer_step(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        p.step += 1
        p.tokens += tc.batch_tokens
        # one all-reduce: the step's loss and counted tokens summed over ranks, and whether any
        # rank got a signal (torch.full: a fill kernel, not a blocking copy from the host)
        signalled = torch.full((), float(stop.signal is not None), device=d.device)
        flags = torch.stack([loss_accum, signalled, counted])
        dist.all_reduce(flags, group=d.group)
        # the step's one host sync: every figure the step logs, in one copy (as llm.c)
        loss_value, stop_requested, counted_tokens, norm = torch.cat(
            [flags, grad_norm.reshape(1).to(flags.dtype)]
        ).tolist()
        self.log_step(loss_value / d.world_size, norm, counted_tokens, time.time() - t0)
        return bool(stop_requested)

    def log_step(self, loss: float, norm: float, counted_tokens: float, dt: float) -> None:
        """The step's metrics line and llm.c's step line; a NaN/inf loss stops the run."""
        tc, p = self.tc, self.progress
        if not math.isfinite(loss):
            raise NonFiniteLossError(
                f"step {p.step}: the training loss is {loss}; stopping. The last good"
                f" checkpoint is {self.ckpt.newest() or '(none yet)'}; lower the lr or check"
                " the data."
            )
        lr = self.optimizer.param_groups[0]["lr"]
        tokens_per_s = tc.batch_tokens / dt
        step_flops = self.flops_per_token * tc.batch_tokens  # llm.c's formula
        if self.task.sparse_targets:  # the head ran on the counted tokens only
            step_flops -= self.head_flops_per_token * (tc.batch_tokens - counted_tokens)
        mfu = step_flops / dt / (self.peak * self.d.world_size)
        record = {
            "loss": loss, "lr": lr, "grad_norm": norm, "tokens_per_s": tokens_per_s, "mfu": mfu,
        }  # fmt: skip
        position = self.loader.state_dict()
        for key in ("tokens_by_source", "epochs_by_source"):  # a mixture's (MixtureLoader)
            if key in position:
                record[key] = position[key]
        self.write(record)
        self.attempt.stepped(p.step)
        self.say(
            f"loss {loss:.6f} | lr {lr:.2e} | norm {norm:.4f} | {dt * 1000:.1f} ms"
            f" | {100 * mfu:.1f}% MFU | {tokens_per_s:,.0f} tok/s"
        )

    def checkpoint(self, stop_requested: bool) -> None:
        """A checkpoint when one is due, or on a signal. Asynchronous (train.checkpoint_async)
        while training goes on, except the last and the one on a signal, which must be on disk
        before the exit."""
        step = self.progress.step
        if not (self.ckpt.should_save(step, self.tc.max_steps) or stop_requested):
            return
        blocking = stop_requested or step == self.tc.max_steps
        state = self.progress.state(self.loader)
        path = self.ckpt.save(step, self.model, self.optimizer, state, blocking=blocking)
        log.info("saved checkpoint %s" if blocking else "saving checkpoint %s", path)
        self.attempt.saved(step)

    def stopped(self, stop: StopFlag) -> int:
        """The exit after a signal's checkpoint: a retry resumes from it. One line in the log
        (rank 0's), which the onerror hook reads back (lmpipe.failures)."""
        if self.d.is_main:
            log.warning(stop_line(self.progress.step, stop.name))
        self.metrics.close()
        self.attempt.end("signal", signal=stop.name)
        return EXIT_STOPPED

    def finish(self) -> int:
        """final/: the weights and meta.json, the contract with convert."""
        p, d, wall = self.progress, self.d, self.progress.wall_s()
        meta = {
            "run": self.job.run,
            "model": dataclasses.asdict(self.job.model),
            "train": dataclasses.asdict(self.tc),
            "during_training": self.job.during_training,  # the evaluations' settings
            "settings_hash": self.digest,
            "step": p.step,
            "tokens": p.tokens,
            "world_size": d.world_size,
            "wall_s": wall,
            "eval_s": p.eval_s,  # of wall_s: every evaluation during training
            "evals_s": p.evals_s,  # of eval_s: each evaluation's
            "gpu_hours": wall / 3600 * d.world_size if d.device.type == "cuda" else 0.0,
            **self.task.meta,
        }
        save_final(self.out / "final", self.model, meta)
        log.info("wrote %s after %d steps, %.1f s", self.out / "final", p.step, wall)
        self.metrics.close()
        self.attempt.end("finished")
        return 0


def run(
    job: TrainJob,
    task: Task,
    out: Path,
    d: Dist,
    stop: StopFlag,
    fresh_start: bool = False,
    evaluators: list[Evaluator] | None = None,
    wandb: WandbConfig | None = None,
) -> int:
    """Run (or resume) the training of one run; returns the process exit code. `evaluators`: the
    evaluations during training (lmpipe.train.evaluators); `wandb`: logging.wandb."""
    check_compiler(job)
    check_compile(job)
    check_fp8(job)
    check_attention(job)
    trainer = Trainer(job, task, out, d, list(evaluators or []))
    try:
        trainer.start(fresh_start, wandb)
        if trainer.progress.step == 0:
            trainer.validate()  # also FSDP2's lazy init, which the evaluators' unshard needs
            trainer.evaluate()
        tc = task.train
        while trainer.progress.step < tc.max_steps:
            stop_requested = trainer.train_step(stop)
            step = trainer.progress.step
            if step == tc.max_steps or (tc.val_every > 0 and step % tc.val_every == 0):
                trainer.validate()
            trainer.evaluate()
            trainer.checkpoint(stop_requested)
            if stop_requested:
                return trainer.stopped(stop)
        return trainer.finish()
    except BaseException as e:  # an attempt killed outright writes nothing: that is its record
        trainer.attempt.end("error", error=short_error(e))
        raise
    finally:
        trainer.loader.close()  # stop the read-ahead thread, whatever ends the run


def eval_input(text: str) -> tuple[str, Path]:
    """`--eval-input kind=path` as (kind, path)."""
    kind, sep, path = text.partition("=")
    if not (kind and sep and path):
        raise argparse.ArgumentTypeError(f"{text!r}: expected KIND=PATH")
    return kind, Path(path)


def worker_main(
    argv: list[str] | None,
    make_task: Callable[[TrainJob, Path, Dist, Path | None, Path | None], Task],
    description: str,
) -> int:
    """A torchrun worker: parse the launcher's arguments, join the process group, build the
    task, train. `make_task(job, data, dist, init, replay)` is the worker's own part."""
    parser = argparse.ArgumentParser(description=description, fromfile_prefix_chars=PREFIX)
    parser.add_argument(
        "--config-json", required=True, help="the train rule's params (JSON, or @FILE holding it)"
    )
    parser.add_argument("--data", required=True, type=Path, help="the data's manifest.json")
    parser.add_argument("--out", required=True, type=Path, help="the run's train/ folder")
    parser.add_argument("--init", type=Path, help="starting weights (fine-tuning)")
    parser.add_argument(
        "--replay", type=Path, help="the text replayed in fine-tuning: its tokens manifest"
    )
    parser.add_argument(
        "--eval-input", action="append", default=[], type=eval_input, metavar="KIND=PATH",
        help="a file the evaluations during training read, by kind (an Evaluation's inputs)",
    )  # fmt: skip
    parser.add_argument(
        "--fresh-start", action="store_true", help="move old checkpoints aside; start at step 0"
    )
    parser.add_argument("--wandb", help="the run's logging.wandb (JSON or @FILE); absent: off")
    args = parser.parse_args(argv)
    stop = StopFlag()  # first: a signal during start-up is acted on at the first step boundary
    job = TrainJob.from_json(args.config_json)
    rank = int(os.environ.get("RANK", 0))
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun worker: never outlive the agent
        die_with_parent()
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    if job.launch.device == "cpu":
        keep_freed_memory()
    d = init_distributed(job.launch.device)
    try:
        task = make_task(job, args.data, d, args.init, args.replay)
        evaluators = build_evaluators(job, dict(args.eval_input), d, task.train)
        wandb = build(WandbConfig, json.loads(args.wandb), "--wandb") if args.wandb else None
        return run(job, task, args.out, d, stop, args.fresh_start, evaluators, wandb)
    finally:
        # the run is over: a stop signal now (a repeated SIGUSR1, as SLURM and the launcher both
        # send one; a Ctrl-C after the last step) must not kill the exit, with a code torchrun
        # would take for a failure. Python resets its handlers to the default while finalizing,
        # not ignored signals.
        for sig in (signal.SIGUSR1, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        dist.destroy_process_group()
