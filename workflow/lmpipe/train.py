"""The training stage: `torchrun -m lmpipe.train` (or plain `python -m lmpipe.train`, one process).

    torchrun --standalone --nproc-per-node=2 -m lmpipe.train \\
        --config-json "$(cat cfg.json)" --tokens-manifest tokens/manifest.json \\
        --out results/runs/embedded-a/train

`--config-json` is the rule's params (lmpipe.config.train_params): run, dataset, model, train and
the launch keys that shape the run. Writes under --out: `metrics.jsonl`, `tb/`, `provenance.json`,
`checkpoints/step_NNNNNN/` (resumed automatically) and `final/` (the contract with `convert`).

The loop is llm.c's / nanoGPT's: gradient accumulation to `batch_tokens`, AdamW (weight decay on
2-D weights only), linear warmup then cosine decay to a floor, gradient clipping. A NaN/inf loss
stops the run with an error; SIGUSR1/SIGTERM save a checkpoint and exit with EXIT_STOPPED.
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
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.tensor import DTensor
from torch.utils.tensorboard import SummaryWriter

from lmpipe import provenance, sft
from lmpipe.checkpoint import Checkpointer, save_final
from lmpipe.config import ModelConfig, TrainConfig, from_dict, settings_hash
from lmpipe.loader import ShardLoader, shard_files, val_batches
from lmpipe.model import GPT, GPTConfig
from lmpipe.parallel import Dist, die_with_parent, init_distributed, local_numel, parallelize

log = logging.getLogger("lmpipe.train")

EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped by a signal after a checkpoint; a retry resumes
# train settings that never change the trajectory (logging and checkpointing only)
NOT_TRAJECTORY = ("val_every", "val_tokens", "checkpoint_every", "keep_checkpoints")


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training cannot continue from this state."""


def get_lr(step: int, tc: TrainConfig) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine to the floor."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    min_lr = tc.lr * tc.lr_floor
    decay_ratio = (step - tc.warmup_steps) / max(1, tc.max_steps - tc.warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(decay_ratio, 1.0)))  # 1 -> 0
    return min_lr + coeff * (tc.lr - min_lr)


def trajectory_hash(cfg: dict[str, Any], tc: TrainConfig, manifest: Path, world_size: int) -> str:
    """Hash of what shapes the trajectory: model, train settings, data (shard digests), ranks."""
    shards = json.loads(manifest.read_text()).get("shards", [])
    train = {k: v for k, v in dataclasses.asdict(tc).items() if k not in NOT_TRAJECTORY}
    return settings_hash(
        {
            "model": cfg["model"],
            "train": train,
            "dataset": cfg["dataset"],
            "shards": [s.get("sha256", s["file"]) for s in shards],
            "world_size": world_size,
        }
    )


def make_optimizer(model: torch.nn.Module, tc: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on 2-D weights (matmuls, embeddings) only, not biases/LayerNorms."""
    params = list(model.parameters())  # tied wte/lm_head appears once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=tc.lr, betas=tc.betas, eps=tc.eps, fused=tc.fused_adamw)


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Global gradient norm over all shards (clipped to max_norm unless 0), as torchtitan does."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()  # sum of the ranks' partial norms
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list, device: torch.device) -> float:
    """Mean validation loss over this rank's batches, averaged over ranks."""
    total = torch.zeros((), device=device)
    for x, y in batches:
        _, loss = model(x.to(device), y.to(device))
        total += loss
    dist.all_reduce(total)  # SUM (gloo has no AVG)
    return total.item() / (len(batches) * dist.get_world_size())  # host sync


class StopFlag:
    """Set by SIGUSR1/SIGTERM; the loop acts on it at the next step boundary, on all ranks."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal = signum


class Metrics:
    """metrics.jsonl + TensorBoard (rank 0); on resume, lines after the resumed step are dropped."""

    def __init__(self, out: Path, resume_step: int, enabled: bool):
        self.enabled = enabled
        if not enabled:
            return
        self.path = out / "metrics.jsonl"
        kept = []
        if resume_step > 0 and self.path.exists():
            kept = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
            kept = [ln for ln in kept if json.loads(ln)["step"] <= resume_step]
        elif (out / "tb").exists():
            shutil.rmtree(out / "tb")  # a fresh start: old events would mix two trajectories
        self.path.write_text("".join(ln + "\n" for ln in kept))
        self.file = open(self.path, "a")
        self.tb = SummaryWriter(
            str(out / "tb"), purge_step=resume_step + 1 if resume_step else None
        )

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        for key, value in record.items():
            if key not in ("step", "tokens") and value is not None:
                self.tb.add_scalar(
                    f"{'val' if key == 'val_loss' else 'train'}/{key}", value, record["step"]
                )

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            self.tb.close()


def pretraining_loaders(manifest: Path, tc: TrainConfig, d: Dist) -> tuple[ShardLoader, list]:
    """The train loader over the token shards and this rank's validation batches."""
    loader = ShardLoader(
        shard_files(manifest, "train"),
        tc.micro_batch,
        tc.seq_len,
        tc.batch_tokens,
        d.rank,
        d.world_size,
    )
    val = val_batches(
        shard_files(manifest, "val")[0],
        tc.micro_batch,
        tc.seq_len,
        tc.val_tokens,
        d.rank,
        d.world_size,
    )
    return loader, val


def train(cfg: dict[str, Any], manifest: Path, out: Path, d: Dist, init: Path | None = None) -> int:
    """Run (or resume) the training of one run; returns the process exit code.

    A fine-tuning run (`cfg["sft"]`, lmpipe.sft) reads conversations from `manifest` and starts
    from the weights at `init`.
    """
    model_cfg = from_dict(ModelConfig, cfg["model"], "model")
    tc = from_dict(TrainConfig, dict(cfg["train"], betas=tuple(cfg["train"]["betas"])), "train")
    if "sft" in cfg:  # steps and warmup follow from the epochs and the number of conversations
        tc = sft.schedule(tc, cfg["sft"], manifest)
    launch = cfg["launch"]
    stop = StopFlag()  # first: a signal during start-up is acted on at the first step boundary
    accum = tc.grad_accum_steps(d.world_size)
    digest = trajectory_hash(cfg, tc, manifest, d.world_size)
    if d.device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
        torch.backends.cudnn.allow_tf32 = True

    # the model: the same seed on every rank gives the same full weights before sharding
    torch.manual_seed(tc.seed)
    model = GPT(GPTConfig(**dataclasses.asdict(model_cfg)))
    model.head_on_counted_only = "sft" in cfg  # conversations: ~3/4 prompt and padding tokens
    if init is not None:  # fine-tuning; another base's checkpoints are never resumed
        digest = settings_hash([digest, sft.load_base(model, init)])
    model = parallelize(model, d.device, tc.dtype, tc.compile)
    flops_per_token = model.flops_per_token(tc.seq_len)
    head_flops_per_token = model.head_flops_per_token()
    optimizer = make_optimizer(model, tc)
    if "sft" in cfg:
        loader, val = sft.loaders(manifest, tc, d.rank, d.world_size)
    else:
        loader, val = pretraining_loaders(manifest, tc, d)

    # resume from the newest checkpoint of these settings, if any
    ckpt = Checkpointer(out / "checkpoints", digest, tc.checkpoint_every, tc.keep_checkpoints)
    step, tokens, wall_before = 0, 0, 0.0
    resume = ckpt.find_resume()
    if resume is not None:
        state = ckpt.load(resume, model, optimizer)
        loader.load_state_dict(state["loader"])
        step, tokens, wall_before = state["step"], state["tokens"], state["wall_s"]
        log.info("resumed from %s (step %d, %d tokens)", resume, step, tokens)
    metrics = Metrics(out, step, d.is_main)
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
            "nodes": launch.get("nodes", 1),
            "settings_hash": digest,
            "hosts": hosts,
            "slurm_nodes": slurm_nodes,
            "params": model.num_params(),
            "params_per_rank": held,
        }
        (out / "provenance.json").write_text(json.dumps(prov, indent=1))
        log.info(
            "%s: %d parameters, %d ranks x %d micro-batches x %d x %d = %d tokens a step",
            cfg["run"], model.num_params(), d.world_size, accum, tc.micro_batch, tc.seq_len,
            tc.batch_tokens,
        )  # fmt: skip

    t_start = time.time()

    def wall_s() -> float:
        return wall_before + time.time() - t_start

    def validate() -> None:
        val_loss = evaluate(model, val, d.device)
        metrics.write({"step": step, "tokens": tokens, "val_loss": val_loss, "wall_s": wall_s()})
        if d.is_main:
            print(f"step {step:5d}/{tc.max_steps} | val loss {val_loss:.4f}", flush=True)

    if step == 0:
        validate()
    while step < tc.max_steps:
        t0 = time.time()
        lr = get_lr(step, tc)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_accum = torch.zeros((), device=d.device)
        counted = torch.zeros((), device=d.device)  # fine-tuning: tokens the head ran on
        for _ in range(accum):
            x, y = loader.next_batch()
            x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
            _, loss = model(x, y)
            loss = loss / accum  # the gradient of the mean over the whole step
            loss_accum += loss.detach()
            if model.head_on_counted_only:
                counted += (y != -1).sum()  # -1: the model's "does not count" target
            loss.backward()  # FSDP reduce-scatters each block's gradients (mean over ranks)
        grad_norm = clip_grad_norm(model, tc.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens += tc.batch_tokens
        # one all-reduce: the step's loss and counted tokens summed over ranks, and whether any
        # rank got a signal
        signalled = torch.tensor(float(stop.signal is not None), device=d.device)
        flags = torch.stack([loss_accum, signalled, counted])
        dist.all_reduce(flags)
        loss_value, stop_requested, counted_tokens = flags.tolist()  # host sync: the step is done
        loss_value /= d.world_size
        dt = time.time() - t0
        if not math.isfinite(loss_value):
            newest = ckpt.newest()
            raise NonFiniteLossError(
                f"step {step}: the training loss is {loss_value}; stopping. The last good"
                f" checkpoint is {newest or '(none yet)'}; lower train.lr or check the data."
            )
        tokens_per_s = tc.batch_tokens / dt
        step_flops = flops_per_token * tc.batch_tokens  # llm.c's formula
        if model.head_on_counted_only:  # fine-tuning: the head ran on the counted tokens only
            step_flops -= head_flops_per_token * (tc.batch_tokens - counted_tokens)
        mfu = step_flops / dt / (launch["peak_flops"] * d.world_size)
        metrics.write(
            {
                "step": step,
                "tokens": tokens,
                "loss": loss_value,
                "lr": lr,
                "grad_norm": grad_norm.item(),
                "tokens_per_s": tokens_per_s,
                "mfu": mfu,
                "wall_s": wall_s(),
            }
        )
        if d.is_main:  # llm.c's step line
            print(
                f"step {step:5d}/{tc.max_steps} | loss {loss_value:.6f} | lr {lr:.2e}"
                f" | norm {grad_norm.item():.4f} | {dt * 1000:.1f} ms | {100 * mfu:.1f}% MFU"
                f" | {tokens_per_s:,.0f} tok/s",
                flush=True,
            )
        if step == tc.max_steps or (tc.val_every > 0 and step % tc.val_every == 0):
            validate()
        saved = ckpt.should_save(step, tc.max_steps)
        if saved or stop_requested:
            state = {"tokens": tokens, "loader": loader.state_dict(), "wall_s": wall_s()}
            path = ckpt.save(step, model, optimizer, state)
            log.info("saved checkpoint %s", path)
        if stop_requested:
            log.warning("stopping at step %d on a signal; a restart resumes from there", step)
            # a repeated SIGUSR1 (SLURM and the launcher both send one) must not kill the exit:
            # Python resets its handlers to the default while finalizing, not ignored signals
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            metrics.close()
            return EXIT_STOPPED

    wall = wall_s()
    meta = {
        "run": cfg["run"],
        "model": dataclasses.asdict(model_cfg),
        "train": dataclasses.asdict(tc),
        "settings_hash": digest,
        "step": step,
        "tokens": tokens,
        "world_size": d.world_size,
        "wall_s": wall,
        "gpu_hours": wall / 3600 * d.world_size if d.device.type == "cuda" else 0.0,
    }
    if init is not None:
        meta["init"] = str(init)
    save_final(out / "final", model, meta)
    log.info("wrote %s after %d steps, %.1f s", out / "final", step, wall)
    metrics.close()
    return 0


@record
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config-json", required=True, help="the train rule's params (JSON)")
    parser.add_argument("--tokens-manifest", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path, help="the run's train/ folder")
    parser.add_argument(
        "--init", type=Path, help="fine-tuning: a base's final/ checkpoint or a Hugging Face folder"
    )
    args = parser.parse_args(argv)
    cfg = json.loads(args.config_json)
    rank = int(os.environ.get("RANK", 0))
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun worker: never outlive the agent
        die_with_parent()
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    d = init_distributed(cfg["launch"]["device"])
    try:
        return train(cfg, args.tokens_manifest, args.out, d, args.init)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
