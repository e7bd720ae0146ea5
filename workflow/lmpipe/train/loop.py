"""The training loop, the same for every kind of training: what differs comes in as a `Task`.

A worker (`torchrun -m lmpipe.train.pretrain`, or `lmpipe.chat.finetune`) builds its Task (the
loaders, the steps and schedule, the starting weights, which targets count) and calls `run`.
The loop is llm.c's / nanoGPT's: gradient accumulation to `batch_tokens`, the optimizer of
`train.optimizer` with the schedule's lr, gradient clipping, validation every `val_every` steps,
HellaSwag every `eval_every` steps (llm.c's in-training eval) and, at the same steps, the suite
tasks of `eval_tasks` (lmpipe.train.suite), a DCP checkpoint every
`checkpoint_every` steps. A NaN/inf loss stops the run with an error;
SIGUSR1/SIGTERM save a checkpoint and exit with EXIT_STOPPED, for a retry to resume.

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
from lmpipe.config import TrainConfig, TrainJob, WandbConfig, build, settings_hash
from lmpipe.data.loader import Batch, Loader
from lmpipe.data.prefetch import Prefetcher
from lmpipe.eval.hellaswag import load_items
from lmpipe.hardware import CPU_NOMINAL_PEAK, gpu_peak_flops
from lmpipe.models import build_model
from lmpipe.train.attempts import AttemptLog, short_error
from lmpipe.train.checkpoint import Checkpointer, save_final
from lmpipe.train.hellaswag import hellaswag_correct, hellaswag_share
from lmpipe.train.metrics import Metrics, WandbRun
from lmpipe.train.optim import build_optimizer, clip_grad_norm, lr_at
from lmpipe.train.parallel import Dist, die_with_parent, init_distributed, local_numel, parallelize
from lmpipe.train.suite import suite_shares, task_correct
from lmpipe.train.wandb_log import run_config as wandb_config

log = logging.getLogger("lmpipe.train")

EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped by a signal after a checkpoint; a retry resumes
# train settings that never change the trajectory (logging, evaluation and checkpointing only)
NOT_TRAJECTORY = (
    "val_every", "val_tokens", "eval_every", "eval_items", "eval_tasks", "eval_task_items",
    "checkpoint_every", "keep_checkpoints", "checkpoint_async",
)  # fmt: skip


@dataclass
class Task:
    """What a kind of training brings to the loop; the loop knows nothing else of it."""

    train: TrainConfig  # the run's settings, max_steps and schedule resolved
    loader: Loader
    val_batches: list[Batch]  # this rank's share of the validation data
    data_identity: Any  # what the data adds to the settings hash (e.g. the shards' sha256)
    # copies the starting weights into the freshly built, unsharded model and returns their
    # identity (hashed too, so another base's checkpoints are never resumed); None: random init
    init: Callable[[torch.nn.Module], str] | None = None
    sparse_targets: bool = False  # most targets are -1: the LM head runs on counted ones only
    meta: dict[str, Any] = field(default_factory=dict)  # extra keys for final/meta.json


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training cannot continue from this state."""


class StopFlag:
    """Set by SIGUSR1/SIGTERM; the loop acts on it at the next step boundary, on all ranks."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal = signum

    @property
    def name(self) -> str | None:
        """The signal's name ("SIGUSR1"), for the attempt's record."""
        return None if self.signal is None else signal.Signals(self.signal).name


def trajectory_hash(job: TrainJob, task: Task, world_size: int) -> str:
    """Hash of what shapes the trajectory: model, train settings, data, ranks (not logging)."""
    train = {k: v for k, v in dataclasses.asdict(task.train).items() if k not in NOT_TRAJECTORY}
    return settings_hash(
        {
            "model": dataclasses.asdict(job.model),
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


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[Batch], device: torch.device) -> float:
    """Mean validation loss over this rank's batches, averaged over ranks."""
    total = torch.zeros((), device=device)
    for x, y in batches:
        _, loss = model(x.to(device), y.to(device))
        total += loss
    dist.all_reduce(total)  # SUM (gloo has no AVG)
    return total.item() / (len(batches) * dist.get_world_size())  # host sync


def write_provenance(
    job: TrainJob, model: torch.nn.Module, d: Dist, digest: str, peak: float, out: Path
) -> None:
    """provenance.json: code, packages, hosts and how the parameters are spread over the ranks."""
    hosts, held = [None] * d.world_size, [None] * d.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    # each rank's SLURM node name (None outside SLURM): test slurmds on one machine share a host
    slurm_nodes = [None] * d.world_size
    dist.all_gather_object(slurm_nodes, os.environ.get("SLURMD_NODENAME"))
    dist.all_gather_object(held, local_numel(model))  # parameter elements each rank holds
    if d.is_main:
        prov = provenance.collect() | {
            "world_size": d.world_size,
            "device": d.device.type,
            "nodes": job.launch.nodes,
            "settings_hash": digest,
            "hosts": hosts,
            "slurm_nodes": slurm_nodes,
            "params": model.num_params(),
            "params_per_rank": held,
            "peak_flops": peak,  # a device's, for the MFU figures
        }
        (out / "provenance.json").write_text(json.dumps(prov, indent=1))


def run(
    job: TrainJob,
    task: Task,
    out: Path,
    d: Dist,
    stop: StopFlag,
    fresh_start: bool = False,
    hellaswag: Path | None = None,
    wandb: WandbConfig | None = None,
    suite: Path | None = None,
) -> int:
    """Run (or resume) the training of one run; returns the process exit code. `hellaswag`: the
    items file of HellaSwag during training (train.eval_every > 0); `wandb`: logging.wandb;
    `suite`: the suite's data manifest (train.eval_tasks)."""
    tc = task.train
    check_compiler(job)
    share = None
    if tc.eval_every > 0:
        if hellaswag is None:
            raise ValueError(
                f"runs.{job.run}.train.eval_every is {tc.eval_every}: HellaSwag during training"
                " needs its items file (--hellaswag)"
            )
        share = hellaswag_share(load_items(hellaswag, tc.eval_items), d.rank, d.world_size)
    suite_tasks = []  # this rank's share of each train.eval_tasks task
    if tc.eval_tasks:
        if suite is None or share is None:
            raise ValueError(
                f"runs.{job.run}.train.eval_tasks: the suite tasks are scored with HellaSwag"
                " during training: they need train.eval_every > 0 and the suite's data (--suite)"
            )
        suite_tasks = suite_shares(suite, tc.eval_tasks, tc.eval_task_items, d.rank, d.world_size)
    accum = tc.grad_accum_steps(d.world_size)
    digest = trajectory_hash(job, task, d.world_size)
    peak = peak_flops(job, d.device)  # a device's FLOP/s, for MFU
    if d.device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
        torch.backends.cudnn.allow_tf32 = True

    # the model: the same seed on every rank gives the same full weights before sharding
    torch.manual_seed(tc.seed)
    model = build_model(job.model)
    model.head_on_counted_only = task.sparse_targets
    model.padded_head_matmul = d.device.type == "cuda"  # aligned GEMM shapes (llm.c's padding)
    if task.init is not None:  # e.g. fine-tuning: another base's checkpoints are never resumed
        digest = settings_hash([digest, task.init(model)])
    model = parallelize(model, d.device, tc.dtype, tc.compile, tc.fsdp)
    flops_per_token = model.flops_per_token(tc.seq_len)
    head_flops_per_token = model.head_flops_per_token()
    optimizer = build_optimizer(model, tc.optimizer)
    peak_lrs = [group["lr"] for group in optimizer.param_groups]
    # batches are read ahead on a thread (pinned for the GPU: asynchronous copies); its
    # position stays the loop's own, so checkpoints resume exactly
    loader = Prefetcher(task.loader, pin=d.device.type == "cuda")
    attempt = AttemptLog(out, d.is_main)
    try:
        # resume from the newest checkpoint of these settings, if any
        ckpt = Checkpointer(
            out / "checkpoints",
            digest,
            tc.checkpoint_every,
            tc.keep_checkpoints,
            asynchronous=tc.checkpoint_async,
        )
        if fresh_start:
            ckpt.retire_all()
        step, tokens, wall_before, eval_total, suite_total = 0, 0, 0.0, 0.0, 0.0
        resume = ckpt.find_resume()
        if resume is not None:
            state = ckpt.load(resume, model, optimizer)
            loader.load_state_dict(state["loader"])
            step, tokens, wall_before = state["step"], state["tokens"], state["wall_s"]
            eval_total = state.get("eval_s", 0.0)  # seconds of the evals during training
            suite_total = state.get("suite_s", 0.0)  # of which the suite tasks'
            log.info("resumed from %s (step %d, %d tokens)", resume, step, tokens)
        w = WandbRun(wandb, job.run, digest, wandb_config(job, tc)) if wandb else None
        metrics = Metrics(out, step, d.is_main, w)
        attempt.start(step, resume, d.world_size, digest, fresh_start)
        write_provenance(job, model, d, digest, peak, out)
        if d.is_main:
            log.info(
                "%s: %d parameters, %d ranks x %d micro-batches x %d x %d = %d tokens a step;"
                " MFU against %.3g FLOP/s a device",
                job.run, model.num_params(), d.world_size, accum, tc.micro_batch, tc.seq_len,
                tc.batch_tokens, peak,
            )  # fmt: skip

        t_start = time.time()

        def wall_s() -> float:
            return wall_before + time.time() - t_start

        def validate() -> None:
            val_loss = evaluate(model, task.val_batches, d.device)
            metrics.write(
                {"step": step, "tokens": tokens, "val_loss": val_loss, "wall_s": wall_s()}
            )
            if d.is_main:
                print(f"step {step:5d}/{tc.max_steps} | val loss {val_loss:.4f}", flush=True)

        def hellaswag_eval() -> None:
            """HellaSwag and the suite tasks on the model as it is now; their cost printed as a
            share of the wall time."""
            nonlocal eval_total, suite_total
            t0 = time.time()
            right_norm, right = hellaswag_correct(model, share, tc.micro_batch, d.device)
            took = time.time() - t0
            n = share.total
            metrics.write(
                {
                    "step": step,
                    "tokens": tokens,
                    "hellaswag": right_norm / n,  # acc_norm, the report's figure
                    "hellaswag_acc": right / n,
                    "hellaswag_items": n,
                    "eval_s": took,
                    "wall_s": wall_s(),
                }
            )
            if d.is_main:
                print(
                    f"step {step:5d}/{tc.max_steps} | hellaswag acc_norm {right_norm / n:.4f}"
                    f" ({right_norm}/{n}) | {took:.2f} s",
                    flush=True,
                )
            suite_took = suite_eval() if suite_tasks else 0.0
            eval_total += took + suite_took
            suite_total += suite_took
            if d.is_main:  # the cost: every eval so far against the wall time so far
                now = f"hellaswag {took:.2f} s" + (
                    f" + suite {suite_took:.2f} s" if suite_tasks else ""
                )
                so_far = f" (suite {suite_total:.1f} s)" if suite_tasks else ""
                print(
                    f"step {step:5d}/{tc.max_steps} | evals {now}; all evals {eval_total:.1f} s"
                    f"{so_far} = {eval_total / wall_s():.1%} of the wall time so far",
                    flush=True,
                )

        def suite_eval() -> float:
            """The eval_tasks, each as lmpipe.eval.suite scores it; one metrics line for all."""
            t0 = time.time()
            record: dict[str, Any] = {"step": step, "tokens": tokens}
            # a rank's rows a forward: as HellaSwag's, micro_batch items of 4 rows
            batch_rows = 4 * tc.micro_batch
            for suite_task in suite_tasks:
                t_task = time.time()
                counts = task_correct(model, suite_task, batch_rows, d.device)
                n, headline = suite_task.total, suite_task.headline
                head, key = counts[headline], f"suite/{suite_task.name}"
                record |= {key: head / n, f"{key}_acc": counts["acc"] / n, f"{key}_items": n}
                if d.is_main:
                    acc = f", acc {counts['acc'] / n:.4f}" if headline != "acc" else ""
                    print(
                        f"step {step:5d}/{tc.max_steps} | {key} {headline} {head / n:.4f}"
                        f" ({head}/{n}){acc} | {time.time() - t_task:.2f} s",
                        flush=True,
                    )
            took = time.time() - t0
            metrics.write(record | {"eval_s": took, "wall_s": wall_s()})
            return took

        def eval_due() -> bool:
            return share is not None and (step % tc.eval_every == 0 or step == tc.max_steps)

        if step == 0:
            validate()  # also FSDP2's lazy init, which hellaswag_eval's unshard needs first
            if eval_due():
                hellaswag_eval()
        while step < tc.max_steps:
            t0 = time.time()
            for group, peak_lr in zip(optimizer.param_groups, peak_lrs, strict=True):
                group["lr"] = lr_at(step, peak_lr, tc.schedule, tc.max_steps)
            lr = optimizer.param_groups[0]["lr"]
            loss_accum = torch.zeros((), device=d.device)
            counted = torch.zeros((), device=d.device)  # sparse targets: tokens the head ran on
            for _ in range(accum):
                x, y = loader.next_batch()
                x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
                _, loss = model(x, y)
                loss = loss / accum  # the gradient of the mean over the whole step
                loss_accum += loss.detach()
                if task.sparse_targets:
                    counted += (y != -1).sum()  # -1: the model's "does not count" target
                loss.backward()  # FSDP reduce-scatters each block's gradients (mean over ranks)
            grad_norm = clip_grad_norm(model, tc.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            tokens += tc.batch_tokens
            # one all-reduce: the step's loss and counted tokens summed over ranks, and whether any
            # rank got a signal (torch.full: a fill kernel, not a blocking copy from the host)
            signalled = torch.full((), float(stop.signal is not None), device=d.device)
            flags = torch.stack([loss_accum, signalled, counted])
            dist.all_reduce(flags)
            # the step's one host sync: every figure the step logs, in one copy (as llm.c)
            loss_value, stop_requested, counted_tokens, norm = torch.cat(
                [flags, grad_norm.reshape(1).to(flags.dtype)]
            ).tolist()
            loss_value /= d.world_size
            dt = time.time() - t0
            if not math.isfinite(loss_value):
                newest = ckpt.newest()
                raise NonFiniteLossError(
                    f"step {step}: the training loss is {loss_value}; stopping. The last good"
                    f" checkpoint is {newest or '(none yet)'}; lower the lr or check the data."
                )
            tokens_per_s = tc.batch_tokens / dt
            step_flops = flops_per_token * tc.batch_tokens  # llm.c's formula
            if task.sparse_targets:  # the head ran on the counted tokens only
                step_flops -= head_flops_per_token * (tc.batch_tokens - counted_tokens)
            mfu = step_flops / dt / (peak * d.world_size)
            metrics.write(
                {
                    "step": step,
                    "tokens": tokens,
                    "loss": loss_value,
                    "lr": lr,
                    "grad_norm": norm,
                    "tokens_per_s": tokens_per_s,
                    "mfu": mfu,
                    "wall_s": wall_s(),
                }
            )
            attempt.stepped(step)
            if d.is_main:  # llm.c's step line
                print(
                    f"step {step:5d}/{tc.max_steps} | loss {loss_value:.6f} | lr {lr:.2e}"
                    f" | norm {norm:.4f} | {dt * 1000:.1f} ms | {100 * mfu:.1f}% MFU"
                    f" | {tokens_per_s:,.0f} tok/s",
                    flush=True,
                )
            if step == tc.max_steps or (tc.val_every > 0 and step % tc.val_every == 0):
                validate()
            if eval_due():
                hellaswag_eval()
            saved = ckpt.should_save(step, tc.max_steps)
            if saved or stop_requested:
                state = {
                    "tokens": tokens,
                    "loader": loader.state_dict(),
                    "wall_s": wall_s(),
                    "eval_s": eval_total,
                    "suite_s": suite_total,
                }
                # asynchronous (train.checkpoint_async): written while training goes on, except
                # the last and the one on a signal, which must be on disk before the exit
                blocking = stop_requested or step == tc.max_steps
                path = ckpt.save(step, model, optimizer, state, blocking=blocking)
                log.info("saved checkpoint %s" if blocking else "saving checkpoint %s", path)
                attempt.saved(step)
            if stop_requested:
                log.warning("stopping at step %d on a signal; a restart resumes from there", step)
                # a repeated SIGUSR1 (SLURM and the launcher both send one) must not kill the exit:
                # Python resets its handlers to the default while finalizing, not ignored signals
                signal.signal(signal.SIGUSR1, signal.SIG_IGN)
                metrics.close()
                attempt.end("signal", signal=stop.name)
                return EXIT_STOPPED

        wall = wall_s()
        meta = {
            "run": job.run,
            "model": dataclasses.asdict(job.model),
            "train": dataclasses.asdict(tc),
            "settings_hash": digest,
            "step": step,
            "tokens": tokens,
            "world_size": d.world_size,
            "wall_s": wall,
            "eval_s": eval_total,  # of wall_s: HellaSwag and the suite tasks during training
            "suite_eval_s": suite_total,  # of eval_s: the suite tasks
            "gpu_hours": wall / 3600 * d.world_size if d.device.type == "cuda" else 0.0,
            **task.meta,
        }
        save_final(out / "final", model, meta)
        log.info("wrote %s after %d steps, %.1f s", out / "final", step, wall)
        metrics.close()
        attempt.end("finished")
        return 0

    except BaseException as e:  # an attempt killed outright writes nothing: that is its record
        attempt.end("error", error=short_error(e))
        raise
    finally:
        loader.close()  # stop the read-ahead thread, whatever ends the run


def worker_main(
    argv: list[str] | None,
    make_task: Callable[[TrainJob, Path, Dist, Path | None], Task],
    description: str,
) -> int:
    """A torchrun worker: parse the launcher's arguments, join the process group, build the
    task, train. `make_task(job, data, dist, init)` is the worker's own part."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config-json", required=True, help="the train rule's params (JSON)")
    parser.add_argument("--data", required=True, type=Path, help="the data's manifest.json")
    parser.add_argument("--out", required=True, type=Path, help="the run's train/ folder")
    parser.add_argument("--init", type=Path, help="starting weights (fine-tuning)")
    parser.add_argument(
        "--hellaswag", type=Path, help="HellaSwag items for train.eval_every (a rowanz jsonl)"
    )
    parser.add_argument(
        "--suite", type=Path, help="the suite's data manifest.json, for train.eval_tasks"
    )
    parser.add_argument(
        "--fresh-start", action="store_true", help="move old checkpoints aside; start at step 0"
    )
    parser.add_argument("--wandb", help="the run's logging.wandb (JSON); absent: off")
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
    d = init_distributed(job.launch.device)
    try:
        task = make_task(job, args.data, d, args.init)
        wandb = build(WandbConfig, json.loads(args.wandb), "--wandb") if args.wandb else None
        return run(
            job, task, args.out, d, stop, args.fresh_start, args.hellaswag, wandb, args.suite
        )
    finally:
        dist.destroy_process_group()
