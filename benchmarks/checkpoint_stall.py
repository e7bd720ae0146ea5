"""How long a checkpoint stops the training loop: a synchronous save against an asynchronous one.

The real `lmpipe.train.checkpoint.Checkpointer` saves the real training state of a preset
(the model built from config/config.yaml's run, FSDP2 on a 1-rank gloo group, AdamW with its
two moments filled by one step) into a folder on this machine's disk:

- sync:  `save(blocking=True)`, the loop's stall is the whole write (`dcp.save`);
- async: `save(blocking=False)` (`train.checkpoint_async`), the stall is the copy of the state to
  CPU memory; the write goes on in a thread, and `wait()` is how much of it was left.

Prints medians over --repeats, the bytes written and the write rate, and the ratio of the stalls.
The rate is what `resources/throughputs.yaml`'s `io.disk_bytes_per_s` stands for, which the
launcher uses to give torchrun's workers time to save after a SIGTERM (`lmpipe.train.launch`).

    .venv/bin/python benchmarks/checkpoint_stall.py --runs 124m 350m --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from lmpipe.config import run_config
from lmpipe.models import build_model
from lmpipe.paths import REPO_ROOT
from lmpipe.schema import load_config
from lmpipe.train.checkpoint import Checkpointer, tensor_bytes
from lmpipe.train.optim import build_optimizer
from lmpipe.train.parallel import init_distributed, parallelize


def training_state(run: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The run's model (fp32, FSDP2 on this 1-rank group) and its AdamW after one step."""
    rc = run_config(load_config(REPO_ROOT / "config" / "config.yaml"), run)
    torch.manual_seed(0)
    model = parallelize(build_model(rc.model), torch.device("cpu"), "float32", False, rc.train.fsdp)
    optimizer = build_optimizer(model, rc.train.optimizer)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW's exp_avg and exp_avg_sq exist from the first step on
    return model, optimizer


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    return tensor_bytes(model.state_dict()) + tensor_bytes(optimizer.state_dict()["state"])


def one_save(folder: Path, model, optimizer, asynchronous: bool, step: int) -> tuple[float, float]:
    """(the loop's stall, the seconds until the checkpoint is on disk) of one save."""
    ckpt = Checkpointer(folder, "bench", every=1, keep=1, asynchronous=asynchronous)
    state = {"tokens": 0, "loader": {}, "wall_s": 0.0, "eval_s": 0.0}
    t0 = time.perf_counter()
    ckpt.save(step, model, optimizer, state, blocking=not asynchronous)
    stall = time.perf_counter() - t0
    ckpt.wait()
    os.sync()  # the bytes on the disk, not in the page cache
    return stall, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", default=["124m", "350m"], help="config runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a tmp)")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    init_distributed("cpu")
    root = Path(tempfile.mkdtemp(prefix="ckpt-stall-", dir=args.dir))
    rows = []
    try:
        for run in args.runs:
            model, optimizer = training_state(run)
            nbytes = state_bytes(model, optimizer)
            times: dict[str, list[tuple[float, float]]] = {"sync": [], "async": []}
            for i in range(args.repeats):
                for mode in ("sync", "async"):
                    folder = root / run / mode
                    times[mode].append(one_save(folder, model, optimizer, mode == "async", i + 1))
                    shutil.rmtree(folder)
            med = {
                m: tuple(statistics.median(t[k] for t in v) for k in (0, 1))
                for m, v in times.items()
            }
            rows.append((run, nbytes, med))
            del model, optimizer
    finally:
        shutil.rmtree(root, ignore_errors=True)
        dist.destroy_process_group()

    print(
        f"\nmedians of {args.repeats}, one process, fp32 model + AdamW, written under {root.parent}"
    )
    print(
        f"{'run':6} {'state':>9} | {'sync stall':>10} {'rate':>10} | {'async stall':>11}"
        f" {'on disk':>8} | {'stall ratio':>11}"
    )
    for run, nbytes, med in rows:
        (sync, _), (astall, adone) = med["sync"], med["async"]
        print(
            f"{run:6} {nbytes / 1e9:7.2f}GB | {sync:9.2f}s {nbytes / sync / 1e6:7.0f}MB/s |"
            f" {astall:10.2f}s {adone:7.2f}s | {sync / astall:10.1f}x"
        )


if __name__ == "__main__":
    main()
