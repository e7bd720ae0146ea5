"""Signals outside SLURM: the launcher (lmpipe.train.launch) passes SIGTERM to the workers as
SIGUSR1 and a Ctrl-C's SIGINT as SIGINT, once each; the workers save a checkpoint and exit with
EXIT_STOPPED; torchrun (lmpipe.train.agent) exits with it, without its failure report; the
launcher exits non-zero with its agent's code (128 + N if the agent died of signal N), for
Snakemake to retry.

tests/test_train.py covers SIGUSR1 to the launcher end to end (slow), tests/test_interrupt.py a
Ctrl-C on Snakemake; here: SIGTERM and SIGINT. The fast tests run the launcher's forwarding over a
stand-in agent (torchrun's part: workers as its children in sessions of their own, SIGUSR1
ignored) or over real torchrun with stand-in workers, and the loop's stop in process; the slow
one is the real chain."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
import yaml

from conftest import REPO
from lmpipe.config import Placement, TrainJob, train_config, train_params
from lmpipe.data.shards import write_shard
from lmpipe.report.restarts import read_attempts
from lmpipe.schema import load_config
from lmpipe.train import launch, loop
from lmpipe.train.parallel import init_distributed
from lmpipe.train.pretrain import pretraining

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)

# a worker: ready, then waits for signals; "saving a checkpoint" takes longer than the launcher's
# 1-second forwarding tick, so a second SIGUSR1 would be seen; exits 75 once signalled (0 if never)
WORKER = """
import os, signal, sys, time
out, got = sys.argv[1], []
for sig in (signal.SIGUSR1, signal.SIGINT):
    signal.signal(sig, lambda s, f: got.append(signal.Signals(s).name))
open(os.path.join(out, f"ready_{os.getpid()}"), "w").close()
deadline = time.time() + 8
while not got and time.time() < deadline:
    time.sleep(0.01)
time.sleep(1.3 if got else 0)
open(os.path.join(out, f"got_{os.getpid()}"), "w").write(",".join(got))
sys.exit(75 if got else 0)
"""
# torchrun's part: workers as its children, each in a session of its own (as torchrun starts
# them); it fails (exit 3 here) when one does, and records a SIGINT that reaches it
AGENT = """
import os, signal, subprocess, sys
out, got = sys.argv[2], []
signal.signal(signal.SIGINT, lambda s, f: got.append("SIGINT"))
open(os.path.join(out, "agent_pid"), "w").write(str(os.getpid()))
workers = [
    subprocess.Popen([sys.executable, sys.argv[1], out], start_new_session=True) for _ in range(2)
]
code = 3 if any([w.wait() for w in workers]) else 0
open(os.path.join(out, "agent_got"), "w").write(",".join(got))
sys.exit(code)
"""
# the launcher in a process of its own: `python -c LAUNCHER AGENT...` runs its forwarding over AGENT
LAUNCHER = (
    "import os, sys; from lmpipe.train import launch;"
    " sys.exit(launch.run_forwarding(sys.argv[1:], dict(os.environ), to_workers=True))"
)


@pytest.fixture
def own_handlers():
    """Restore this process's SIGUSR1/SIGTERM/SIGINT handlers; meanwhile a stray SIGTERM or
    SIGINT is recorded, not fatal (the code under test installs its own)."""
    saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    stray: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: stray.append(s))
    yield stray
    for s, h in saved.items():
        signal.signal(s, h)


def when_ready(folder: Path, n: int, action) -> threading.Thread:
    """Run `action` on a thread once `n` workers have written their ready file."""

    def wait() -> None:
        deadline = time.time() + 30
        while len(list(folder.glob("ready_*"))) < n and time.time() < deadline:
            time.sleep(0.01)
        action()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_sigterm_reaches_each_worker_once_as_sigusr1(tmp_path, own_handlers):
    """SIGTERM to the launcher: one SIGUSR1 a worker, the agent spared, its exit code returned."""
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "agent.py").write_text(AGENT)
    cmd = [sys.executable, str(tmp_path / "agent.py"), str(tmp_path / "worker.py"), str(tmp_path)]

    def terminate() -> None:
        # as SLURM would, SIGUSR1 to the agent too: started with it ignored, the agent lives on
        os.kill(int((tmp_path / "agent_pid").read_text()), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # to the launcher (this process)

    when_ready(tmp_path, 2, terminate)
    code = launch.run_forwarding(cmd, dict(os.environ), to_workers=True)
    got = sorted(p.read_text() for p in tmp_path.glob("got_*"))
    assert got == ["SIGUSR1", "SIGUSR1"], "each worker: one SIGUSR1"
    assert code == 3, "the agent's own exit code (not 128 + a signal's)"
    assert own_handlers == [], "the launcher handles SIGTERM itself"


def ctrl_c(cmd: list[str], folder: Path, workers: int) -> subprocess.CompletedProcess:
    """Run the launcher's forwarding over `cmd` in a process of its own, as a job's shell `exec`s
    it; once `workers` workers are ready, Ctrl-C as a terminal sends it: SIGINT to the launcher's
    whole process group. `folder` is on the path too (a stand-in worker module)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "workflow"), str(folder)]))
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, *cmd], env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while len(list(folder.glob("ready_*"))) < workers:
            assert launcher.poll() is None and time.time() < deadline, "no workers started"
            time.sleep(0.01)
        os.killpg(launcher.pid, signal.SIGINT)
        out = launcher.communicate(timeout=60)[0]
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return subprocess.CompletedProcess(launcher.args, launcher.returncode, out)


def test_ctrl_c_reaches_the_launcher_only_which_passes_it_to_each_worker_once(tmp_path):
    """torchrun's agent runs in a session of its own, so a terminal's SIGINT misses it (torchrun
    would kill the workers): the launcher alone gets it, sends each worker one SIGINT, and exits
    with the agent's code, without a traceback."""
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "agent.py").write_text(AGENT)
    agent = [sys.executable, str(tmp_path / "agent.py"), str(tmp_path / "worker.py"), str(tmp_path)]
    launcher = ctrl_c(agent, tmp_path, workers=2)
    got = sorted(p.read_text() for p in tmp_path.glob("got_*"))
    assert got == ["SIGINT", "SIGINT"], "each worker: one SIGINT"
    assert (tmp_path / "agent_got").read_text() == "", "the agent got the SIGINT too"
    assert launcher.returncode == 3, launcher.stdout  # the agent's own exit code
    assert "lmpipe.train: got SIGINT" in launcher.stdout and "Traceback" not in launcher.stdout


# a worker under real torchrun: ready, waits for a stop signal, says so, and exits; rank 1 later
# than rank 0, so that torchrun sees rank 0 end first and stops rank 1 itself (SIGTERM)
STOPPING_WORKER = """
import os, signal, sys, time
out, rank0_exit, got = sys.argv[1], int(sys.argv[2]), []
rank = int(os.environ["RANK"])
for sig in (signal.SIGUSR1, signal.SIGINT):
    signal.signal(sig, lambda s, f: got.append(s))
open(os.path.join(out, f"ready_{rank}"), "w").close()
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.01)
print(f"rank {rank}: stopping", flush=True)
time.sleep(5 * rank)
sys.exit(rank0_exit if rank == 0 else 75)
"""


@pytest.mark.parametrize("rank0_exit", [75, 1])
def test_torchrun_keeps_quiet_about_workers_that_stopped_only(tmp_path, rank0_exit):
    """Ctrl-C over real torchrun (lmpipe.train.agent): workers that exit with EXIT_STOPPED (or by
    torchrun's SIGTERM after one has) leave only their own lines, and torchrun exits with 75.
    A rank that fails otherwise gets torchrun's report (ChildFailedError, "Root Cause") in full."""
    (tmp_path / "stopping_worker.py").write_text(STOPPING_WORKER)
    launch_ = tiny_job(1, procs=2).launch
    args = [str(tmp_path), str(rank0_exit)]
    launcher = ctrl_c(launch.torchrun_command(launch_, args, "stopping_worker"), tmp_path, 2)
    lines = launcher.stdout.splitlines()
    if rank0_exit == loop.EXIT_STOPPED:
        assert launcher.returncode == 75, launcher.stdout
        said = ["lmpipe.train: got SIGINT", "rank 0: stopping", "rank 1: stopping"]
        assert lines[0].startswith("+ ") and sorted(lines[1:]) == said, lines  # + the command
    else:
        assert launcher.returncode == 1, launcher.stdout
        assert "ChildFailedError" in launcher.stdout and "Root Cause" in launcher.stdout
        assert re.search(r"failed \(exitcode: 1\) local_rank: 0", launcher.stdout), lines


# srun's part for several nodes: records the signals it gets (the real one passes SIGUSR1 and
# SIGTERM on to the node agents, and answers a single SIGINT with a status report)
SRUN = """
import os, signal, sys, time
out, got = sys.argv[1], []
for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda s, f: got.append(signal.Signals(s).name))
open(os.path.join(out, "ready_srun"), "w").close()
deadline = time.time() + 30
while len(got) < 2 and time.time() < deadline:
    time.sleep(0.01)
open(os.path.join(out, "srun_got"), "w").write(",".join(got))
"""


def test_under_srun_sigint_goes_on_as_sigusr1_and_sigterm_as_itself(tmp_path):
    """Several nodes: the launcher signals srun, not workers. A SIGINT reaches the node agents
    only as SIGUSR1 (srun would keep a single SIGINT to itself); SIGTERM goes on as SLURM's."""
    (tmp_path / "srun.py").write_text(SRUN)
    code = LAUNCHER.replace("to_workers=True", "to_workers=False")
    env = dict(os.environ, PYTHONPATH=str(REPO / "workflow"))
    launcher = subprocess.Popen(
        [sys.executable, "-c", code, sys.executable, str(tmp_path / "srun.py"), str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while not (tmp_path / "ready_srun").exists():
            assert launcher.poll() is None and time.time() < deadline, "srun did not start"
            time.sleep(0.01)
        for sig in (signal.SIGINT, signal.SIGTERM):
            launcher.send_signal(sig)  # to the launcher only
            time.sleep(0.5)
        out = launcher.communicate(timeout=60)[0]
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert (tmp_path / "srun_got").read_text() == "SIGUSR1,SIGTERM", out
    assert launcher.returncode == 0 and "Traceback" not in out, out  # srun's exit code


def test_an_agent_killed_by_a_signal_is_128_plus_it(own_handlers):
    """The shell's convention: an agent that dies of SIGTERM makes the launcher exit 143."""
    code = launch.run_forwarding(["sh", "-c", "kill -TERM $$"], dict(os.environ), True)
    assert code == 128 + signal.SIGTERM


# ---- the workers' side: a signal stops the loop at the next step, after a checkpoint ------------

MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "vocab_size": 256,
         "padded_vocab_size": 256}  # fmt: skip


def tiny_job(max_steps: int, procs: int = 1) -> TrainJob:
    t = {
        "seq_len": 16,
        "micro_batch": 2,
        "batch_tokens": 32 * procs,
        "max_steps": max_steps,
        "optimizer": {"name": "adamw", "lr": 1e-3},
        "val_every": 0,
        "val_tokens": 32,
        "checkpoint_every": 0,  # no periodic checkpoints: the one saved is the signal's
    }
    train = json.loads(json.dumps(dataclasses.asdict(train_config(t, "train"))))
    launch_ = {"device": "cpu", "nodes": 1, "procs_per_node": procs, "peak_flops": 1e12}
    job = {"run": "t", "dataset": "x", "model": MODEL, "train": train, "launch": launch_}
    return TrainJob.from_json(json.dumps(job))


def token_shards(folder: Path) -> Path:
    """A val and a train shard of random tokens below the tiny vocabulary, and their manifest."""
    rng = np.random.default_rng(0)
    shards = []
    for i, split in enumerate(["val", "train"]):
        name = f"x_{split}_{i:06d}.bin"
        write_shard(folder / name, rng.integers(0, 256, 4000).astype(np.uint16))
        shards.append({"file": name, "split": split, "tokens": 4000})
    (folder / "manifest.json").write_text(json.dumps({"dataset": "x", "shards": shards}))
    return folder / "manifest.json"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_a_worker_checkpoints_and_exits_stopped(tmp_path, own_handlers, sig):
    """A worker that got SIGTERM or SIGINT (Ctrl-C) saves the step it is in and returns
    EXIT_STOPPED (75)."""
    job, out = tiny_job(max_steps=4), tmp_path / "train"
    out.mkdir()
    stop = loop.StopFlag()
    os.kill(os.getpid(), sig)  # caught: the flag, acted on at the step's end
    assert stop.signal == sig and own_handlers == []
    assert not dist.is_initialized()
    d = init_distributed("cpu")
    try:
        code = loop.run(job, pretraining(job, token_shards(tmp_path), d, None), out, d, stop)
    finally:
        dist.destroy_process_group()
    assert code == loop.EXIT_STOPPED == 75
    assert [p.name for p in (out / "checkpoints").glob("step_*")] == ["step_000001"]
    assert not (out / "final").exists()
    start, saved, end = read_attempts(out / "attempts.jsonl")  # what the report reads
    assert start == start | {"event": "start", "attempt": 1, "resumed_step": 0, "checkpoint": None}
    assert start["world_size"] == 1 and (saved["event"], saved["step"]) == ("checkpoint", 1)
    assert end == end | {"event": "end", "step": 1, "how": "signal", "signal": sig.name}


# ---- the real chain: launcher, torchrun, a pretraining worker ------------------------------------


@pytest.mark.slow
def test_sigterm_to_the_launcher_checkpoints_and_fails_for_a_retry(tmp_path):
    """`python -m lmpipe.train` gets SIGTERM mid-run: checkpoint, worker 75, launcher non-zero."""
    job = dataclasses.asdict(tiny_job(max_steps=500))
    out = tmp_path / "train"
    cmd = [sys.executable, "-m", "lmpipe.train", "--config-json", json.dumps(job),
           "--data", str(token_shards(tmp_path)), "--out", str(out)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "workflow"))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 240
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and '"loss"' in metrics.read_text()):
            assert proc.poll() is None and time.time() < deadline, "the run did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # to the launcher only, as `kill PID` would
        log = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "lmpipe.train: got SIGTERM" in log, log
    # the workers' EXIT_STOPPED, through torchrun, without its failure report
    assert proc.returncode == loop.EXIT_STOPPED, f"exit code {proc.returncode}\n{log}"
    assert "Root Cause" not in log and "Traceback" not in log, log
    (saved,) = (out / "checkpoints").glob("step_*")
    assert 1 <= int(saved.name.split("_")[1]) < 500 and not (out / "final").exists()


@pytest.mark.parametrize(
    "run, params, grace",
    [
        # 12 bytes a parameter (fp32 weights, AdamW's two moments) at the assumed 5e8 bytes/s,
        # three times over, on top of torchrun's 30 s. Parameters by hand, padded vocab 50304:
        # wte + wpe + layers x (2 LayerNorms, c_attn, attn.c_proj, c_fc, mlp.c_proj) + ln_f
        ("124m", 50304 * 768 + 1024 * 768 + 12 * 7_087_872 + 2 * 768, 39),  # 2.99 s to write
        ("350m", 50304 * 1024 + 1024 * 1024 + 24 * 12_596_224 + 2 * 1024, 56),  # 8.52 s
    ],
)
def test_torchrun_gives_the_workers_time_to_save_after_a_sigterm(run, params, grace):
    """torchrun kills its workers 30 s after a SIGTERM by default; a 350M save needs longer on
    a slow disk, so the launcher passes --shutdown-timeout for the run's checkpoint size."""
    assert yaml.safe_load((REPO / "resources" / "throughputs.yaml").read_text())["io"][
        "disk_bytes_per_s"
    ]["value"] == pytest.approx(5e8)
    config = load_config(REPO / "config" / "config.yaml")
    job = TrainJob.from_json(train_params(config, run))
    assert job.launch.nodes == 1
    assert 30 + math.ceil(3 * 12 * params / 5e8) == grace
    cmd, _ = launch.build_command(job, ["--out", "x"])
    assert f"--shutdown-timeout={grace}" in cmd
    # an option of torchrun (before the worker module), not of the worker
    assert cmd.index(f"--shutdown-timeout={grace}") < cmd.index("-m", 3)


def test_a_torchrun_without_shutdown_timeout_gets_none(monkeypatch):
    """torch 2.11's torchrun has no --shutdown-timeout and stops with a usage error on it: the
    launcher passes it only where this torch's torchrun parser has it."""
    import argparse

    import torch.distributed.run

    launch.torchrun_has_shutdown_timeout.cache_clear()
    monkeypatch.setattr(torch.distributed.run, "get_args_parser", argparse.ArgumentParser)
    try:
        cmd = launch.torchrun_command(Placement("cpu", 1, 1, None), ["--out", "x"], grace_s=45)
    finally:
        launch.torchrun_has_shutdown_timeout.cache_clear()
    assert not any(a.startswith("--shutdown-timeout") for a in cmd)
    assert "--standalone" in cmd and cmd[-3:] == ["lmpipe.train.pretrain", "--out", "x"]


def test_each_rank_compiles_with_its_share_of_the_cores(monkeypatch):
    """8 GPU ranks on a node of 64 cores: 8 Inductor compile workers each, not 64 (and a
    setting of the user's own is kept)."""
    config = load_config(REPO / "config" / "config.yaml")
    job = TrainJob.from_json(train_params(config, "124m"))
    assert (job.launch.device, job.launch.procs_per_node) == ("cuda", 8)
    monkeypatch.setattr(launch, "cpu_count", lambda: 64)
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    _, env = launch.build_command(job, ["--out", "x"])
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "8"
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "2")
    _, env = launch.build_command(job, ["--out", "x"])
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "2"
