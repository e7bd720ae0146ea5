"""Shared fixtures: paths to the repo and its resources (the real data the tests use)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

pytest_plugins = ["no_skips_in_ci"]  # under CI=true a skip is a failure

REPO = Path(__file__).resolve().parents[1]
CONFIG_FILE = REPO / "config" / "config.yaml"
RESOURCES = REPO / "resources"
TOKENIZER_DIR = RESOURCES / "gpt2"

# Multi-rank tests share 2 cores: one thread a rank avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# The files that take longest under `make test` (the durations it prints, summed a file; about
# 33 to 4 minutes each on 2 shared cores), longest first; test_slurm.py is first by its marker.
LONGEST_FILES = (
    "test_pipeline.py", "test_hf_arch.py", "test_train.py", "test_gpu_check.py", "test_bf16.py",
    "test_one_rank.py", "test_sft.py", "test_readme_example.py", "test_tokenizer_stage.py",
    "test_interrupt.py", "test_tokenizer_sweep.py", "test_reference.py", "test_train_eval.py",
    "test_compile.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The SLURM tests first, then the longest files, longest first, then the rest as collected.
    Under `make test` (pytest-xdist, a file a worker, handed out in this order) one worker waits
    on the SLURM tests from the start (they mostly wait on SLURM's scheduling and Snakemake's
    status polls) while the others take the long files first and the short ones last, so that
    no long file starts near the end with the other workers idle."""

    def rank(item: pytest.Item) -> tuple[bool, int]:
        name = item.path.name
        longest = LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)
        return item.get_closest_marker("slurm") is None, longest

    items.sort(key=rank)  # stable: a file's tests, and the rest, in the order collected


@pytest.fixture(scope="module")
def one_rank_group():
    """A one-rank gloo process group for a module's tests (FSDP2 and DCP want one), as
    lmpipe.train.parallel.init_distributed makes it without torchrun; one that exists is kept."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def fineweb_texts() -> list[str]:
    """Real FineWeb documents from the embedded sample."""
    import pyarrow.parquet as pq

    return pq.read_table(RESOURCES / "fineweb_sample.parquet", columns=["text"])["text"].to_pylist()


WORKFLOW_FILES = ("Snakefile", "workflow", "config", "envs", "resources", "slurm", "profiles")


def make_workdir(dest: Path) -> Path:
    """A copy of the workflow (not results/) to run Snakemake in, so tests never touch results/."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy(src, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, timeout: int = 1200, check: bool = True):
    """Run the real `snakemake` CLI in `workdir` under this interpreter (its jobs run under it too,
    whatever PATH holds: workflow/rules/common.smk)."""
    import subprocess
    import sys

    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def kill_at_checkpoint(cmd: list[str], env: dict, out: Path, step: int, timeout: int = 240) -> None:
    """Start a training command, SIGKILL it and every process under it the moment checkpoint
    `step` exists (the launcher, torchrun and workers at once, without warning), and check it had
    not finished by then. Its process group alone is not all of them: torchrun and each worker
    run in sessions of their own (lmpipe.train.launch), and a launcher killed alone makes torchrun
    stop the workers with a checkpoint."""
    import signal
    import subprocess
    import time

    import psutil

    proc = subprocess.Popen(
        cmd,
        env=env,
        start_new_session=True,  # its own process group
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint = out / "checkpoints" / f"step_{step:06d}"
    try:
        deadline = time.time() + timeout
        while not checkpoint.exists():
            assert proc.poll() is None and time.time() < deadline, f"no checkpoint at step {step}"
            time.sleep(0.02)
    finally:
        under = psutil.Process(proc.pid).children(recursive=True)
        for child in reversed(under):  # the workers first: no parent's death is seen to act on
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        psutil.wait_procs(under, timeout=30)
    assert not (out / "final").exists(), "the run finished before it was killed"


# ---- the scorers' reference, and ranks that must finish -----------------------------------------


def naive_logprob(model, ctx: list[int], cont: list[int]) -> float:
    """The reference the batched scorers are held to: one row alone, left-truncated to the
    model's block_size as lm-eval truncates, through the model's plain causal forward, the
    log-softmax over every logit."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        seq = (ctx + cont)[-(model.config.block_size + 1) :]
        logits, _ = model(torch.tensor([seq[:-1]]))
        logp = F.log_softmax(logits[0, -len(cont) :], dim=-1)
        return logp[torch.arange(len(cont)), torch.tensor(cont)].sum().item()


def run_ranks_or_fail(fn, args: tuple, nprocs: int, timeout: float = 120) -> None:
    """Spawn `nprocs` ranks of `fn(rank, *args)` and wait; kill them and fail the test if they
    have not all finished within `timeout` seconds: ranks that ran unequal forward passes under
    FSDP wait for each other in an all-gather forever."""
    import time

    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.time() + timeout
    while not ctx.join(timeout=1):
        if time.time() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the ranks did not finish: unequal forward passes deadlock FSDP")


# ---- reading W&B's own files back (logging.wandb, offline) ---------------------------------------


def wandb_records(path: Path):
    """The protobuf records of a `.wandb` file (wandb 0.31 ships no reader in Python): LevelDB's
    log format, 32 KiB blocks of chunks (crc32, length, type), after a 7-byte W&B header."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    ident, _, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", path
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length, kind) == (0, 0):  # a block's padding
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(out: Path) -> list[dict]:
    """Every row a run's train/ folder `out` logged to W&B offline, attempt after attempt (each
    attempt's offline run is a folder of its own), keys as logged ("train/loss")."""
    import json

    rows = []
    for path in sorted((out / "wandb").glob("wandb/offline-run-*/*.wandb")):
        for r in wandb_records(path):
            if r.WhichOneof("record_type") == "history":
                items = r.history.item
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
    return rows


def planned(workdir: Path, config: dict, targets: list[str]) -> set[tuple[str, str]]:
    """(rule, wildcards) of every job a dry run of `targets` plans under `config`."""
    import re

    import yaml

    path = workdir / f"changed_{len(list(workdir.glob('changed_*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    # the targets first: --configfile takes every argument after it
    out = snakemake(workdir, *targets, "-n", "--configfile", str(path)).stdout
    jobs = set()
    for rule, details in re.findall(r"^(?:local)?rule (\w+):\n((?:[ \t]+.*\n?)*)", out, re.M):
        wc = re.search(r"^\s*wildcards: (.*)$", details, re.M)
        jobs.add((rule, wc.group(1) if wc else ""))
    return jobs


# the stop signals' handlers as this test process started with them
STOP_SIGNALS = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM)
STARTING_HANDLERS = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}


def default_stop_signals() -> None:
    """A child's stop signals at their defaults (Popen's preexec_fn): an ignored signal is
    inherited across exec, and a Snakemake started with SIGINT ignored never stops on Ctrl-C."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def signal_handlers_kept():
    """Each test runs, and leaves, with the stop signals' handlers this process started with. A
    training worker run in this process (the fine-tuning worker's `main`) ignores SIGINT and
    SIGUSR1 as it exits, as its own process must; left so, every process started afterwards by
    this pytest worker inherits the ignored SIGINT."""
    for sig, handler in STARTING_HANDLERS.items():
        signal.signal(sig, handler)
    yield
    for sig, handler in STARTING_HANDLERS.items():
        signal.signal(sig, handler)
