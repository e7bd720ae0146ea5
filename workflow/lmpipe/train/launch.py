"""Start torchrun for a run, the way its `launch:` settings say, and pass signals to the workers.

    python -m lmpipe.train --config-json J --data M --out DIR [--init P] [--replay M]
        [--eval-input KIND=PATH ...] [--wandb JSON] [--worker MODULE]

(the train rule). The worker is a module torchrun runs on every rank: `lmpipe.train.pretrain` by
default, `lmpipe.chat.finetune` for a fine-tuning run; both run lmpipe.train.loop.

- CPU: `torchrun --standalone --nproc-per-node=P` on gloo, OMP_NUM_THREADS = cores / P.
  On any device, TORCHINDUCTOR_COMPILE_THREADS = cores / P: each rank's compile workers share
  the node's cores with the other ranks'.
- one GPU node: `torchrun --standalone --nproc-per-node=G`, one rank a GPU.
- several nodes under SLURM: one torchrun a node through
  `srun --nodes=N --ntasks=N --ntasks-per-node=1`, c10d rendezvous at the allocation's first node
  (asked of squeue/scontrol: the SLURM executor strips most SLURM_* variables).

Signals. SLURM sends SIGUSR1 or SIGTERM before a time limit or a preemption, a terminal's Ctrl-C
sends SIGINT; either way the workers must finish the step, checkpoint and exit non-zero. torchrun's
agent does not forward SIGUSR1 (its default action kills the agent and orphans the workers), and
answers SIGTERM or SIGINT by passing it on and killing the workers `--shutdown-timeout` seconds
later, with a SignalException traceback. So this process, on any of the three, signals the
workers (the agent's children) itself, once each: SIGINT as SIGINT (their record of the stop),
the others as SIGUSR1. They save a checkpoint, rank 0 logs one line, and they exit with
EXIT_STOPPED (lmpipe.failures); torchrun, run by lmpipe.train.agent and told of the stop by a
SIGUSR1, exits with it too, without its failure report, and so does this process: the job fails,
for Snakemake to retry or for the next run to resume.

Who gets a signal: torchrun is started with SIGUSR1 ignored, and in a session of its own, as
torchrun starts each worker. A terminal's Ctrl-C (SIGINT to its foreground process group:
Snakemake, and the job's shell, which `exec`s this process) thus reaches this process and not
torchrun. Snakemake, on Ctrl-C, waits for its running jobs and signals none of them, so the
checkpoint is written before it exits. SLURM signals every process of a job step, whatever its
session (proctrack/cgroup and linuxproc; proctrack/pgid signals this process's group only, and it
passes the signal on). Under srun, the same forwarding runs on every node (`--node-agent`); srun
passes SIGUSR1 and SIGTERM on to the node agents (SIGINT is sent to it as SIGUSR1: srun answers
one SIGINT with a status report).

A SIGTERM that reaches torchrun itself (SLURM signals every process of a job step at a time
limit or on `scancel`) makes its agent stop the workers and kill them `--shutdown-timeout` seconds
later, 30 by default. A worker saving its checkpoint needs longer for a large model on a slow disk
(`benchmarks/checkpoint_stall.py`: 124M's model + AdamW, 1.65 GB, took 9.6 s on this project's
CPU machine), so torchrun gets the time a node's share of that state takes to write at
`io.disk_bytes_per_s`, three times over, on top of the 30 s (`shutdown_timeout`); where torchrun
has no such option (torch 2.11), its fixed 30 s.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from lmpipe.config import Placement, TrainJob
from lmpipe.job_params import PREFIX
from lmpipe.registry import ARCHITECTURES
from lmpipe.throughputs import figure
from lmpipe.train.parallel import die_with_parent
from lmpipe.train.wandb_log import check_installed

RDZV_PORT = 29500
PRETRAIN_WORKER = "lmpipe.train.pretrain"
# set (to anything but "" or "0"): start from step 0, the old checkpoints moved aside. For
# `LMPIPE_FRESH_START=1 snakemake --forcerun results/runs/RUN/train/final`: not a config setting,
# so that it never reruns a job by itself.
FRESH_START_ENV = "LMPIPE_FRESH_START"
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
TORCHRUN_SHUTDOWN_S = 30  # torchrun's own --shutdown-timeout
CHECKPOINT_BYTES_A_PARAM = 12  # fp32 weights and AdamW's two moments
WRITE_MARGIN = 3  # the disk figure is assumed; measured here at a third of it (171 vs 500 MB/s)


def shutdown_timeout(job: TrainJob) -> int:
    """Seconds torchrun waits for its workers after a SIGTERM: 30, plus three times what writing
    this node's share of the checkpoint takes at `io.disk_bytes_per_s` (resources/throughputs.yaml).
    """
    params = ARCHITECTURES[job.model.arch].num_params(job.model)
    node_bytes = CHECKPOINT_BYTES_A_PARAM * params / job.launch.nodes
    write_s = node_bytes / figure("io", "disk_bytes_per_s")
    return TORCHRUN_SHUTDOWN_S + math.ceil(WRITE_MARGIN * write_s)


def cpu_count() -> int:
    """Cores this process may use (the affinity mask, which SLURM and taskset narrow)."""
    return len(os.sched_getaffinity(0))


def _slurm(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def slurm_nodes(job_id: str) -> tuple[list[str], int | None]:
    """Hostnames of the job's nodes and its CPUs a task (asked of the controller)."""
    nodelist = _slurm("squeue", "-h", "-j", job_id, "-o", "%N")
    hosts = _slurm("scontrol", "show", "hostnames", nodelist).split()
    match = re.search(r"CPUs/Task=(\d+)", _slurm("scontrol", "show", "job", job_id))
    return hosts, int(match.group(1)) if match else None


def node_address(node: str) -> str:
    """The address of a SLURM node: its NodeAddr, which may differ from the node's name."""
    match = re.search(r"NodeAddr=(\S+)", _slurm("scontrol", "show", "node", node))
    return match.group(1) if match else node


@functools.cache
def torchrun_has_shutdown_timeout() -> bool:
    """Whether this torch's torchrun takes --shutdown-timeout (torch 2.11's does not, and stops
    with a usage error on it)."""
    from torch.distributed.run import get_args_parser

    return "--shutdown-timeout" in get_args_parser()._option_string_actions


def torchrun_command(
    launch: Placement,
    worker_args: list[str],
    worker: str = PRETRAIN_WORKER,
    head: str | None = None,
    job_id: str | None = None,
    grace_s: int = TORCHRUN_SHUTDOWN_S,
) -> list[str]:
    """torchrun for one node: standalone for one node, c10d rendezvous at `head` for several;
    after a SIGTERM its workers get `grace_s` seconds to save and exit."""
    cmd = [
        sys.executable,
        "-m",
        "lmpipe.train.agent",  # torchrun, quiet after a stop
        f"--nproc-per-node={launch.procs_per_node}",
    ]
    if torchrun_has_shutdown_timeout():  # torch 2.11's has none: it waits its fixed 30 s
        cmd += [f"--shutdown-timeout={grace_s}"]
    if launch.nodes == 1:
        cmd += ["--standalone"]
    else:
        cmd += [
            f"--nnodes={launch.nodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={head}:{RDZV_PORT}",
            f"--rdzv-id={job_id}",
        ]
    return cmd + ["-m", worker, *worker_args]


def build_command(
    job: TrainJob, worker_args: list[str], worker: str = PRETRAIN_WORKER
) -> tuple[list[str], dict[str, str]]:
    """The command line to run on this machine, and its environment."""
    launch, grace_s = job.launch, shutdown_timeout(job)
    env = dict(os.environ)
    nodes = launch.nodes
    share = str(max(1, cpu_count() // launch.procs_per_node))  # a rank's share of the cores
    if launch.device == "cpu":
        # one intra-op thread pool a rank: share the cores instead of oversubscribing them
        env.setdefault("OMP_NUM_THREADS", share)
    # Inductor compiles with as many workers as the machine has cores, in every rank: 8 ranks on
    # 64 cores would start 8 x 64; each gets its share
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", share)
    if nodes == 1:
        return torchrun_command(launch, worker_args, worker, grace_s=grace_s), env
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise RuntimeError(f"launch.nodes is {nodes}: several nodes need a SLURM allocation")
    hosts, cpus_per_task = slurm_nodes(job_id)
    if len(hosts) < nodes:
        raise RuntimeError(f"launch.nodes is {nodes} but SLURM job {job_id} has {hosts}")
    srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
    if cpus_per_task:
        srun.append(f"--cpus-per-task={cpus_per_task}")
    agent = [sys.executable, "-m", "lmpipe.train", "--node-agent", "--"]
    torchrun = torchrun_command(
        launch, worker_args, worker, node_address(hosts[0]), job_id, grace_s
    )
    return srun + agent + torchrun, env


def _prepare_agent() -> None:
    """In the child before exec: ignore SIGUSR1 (an ignored signal stays ignored across exec, so
    the agent survives it), and get SIGTERM if this launcher dies (the agent then stops its
    workers, which checkpoint first)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    die_with_parent(signal.SIGTERM)


def passed_on(signum: int, to_workers: bool) -> signal.Signals:
    """The signal the workers (to_workers) or srun get for the one this process got: SIGINT as
    SIGINT to the workers, their record of the stop; SIGUSR1 for everything else, but SIGTERM
    to srun (passed on as SLURM's own)."""
    if signum == signal.SIGINT:
        return signal.SIGINT if to_workers else signal.SIGUSR1
    return signal.SIGUSR1 if to_workers else signal.Signals(signum)


def stop_workers(agent: subprocess.Popen, sig: signal.Signals, signalled: set[int]) -> None:
    """`sig` once to each worker (the agent's children), and SIGUSR1 once to the agent, which then
    keeps quiet about workers that stop (lmpipe.train.agent). Called on the signal, then every
    second (torchrun may still be spawning workers). Never twice: a worker that has saved and is
    exiting has Python's handlers reset, and a second signal would kill it instead of its exit
    code."""
    try:
        procs = [psutil.Process(agent.pid), *psutil.Process(agent.pid).children()]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        if proc.pid not in signalled:
            signalled.add(proc.pid)
            try:
                proc.send_signal(signal.SIGUSR1 if proc.pid == agent.pid else sig)
            except psutil.NoSuchProcess:
                pass


def run_forwarding(cmd: list[str], env: dict[str, str], to_workers: bool) -> int:
    """Run `cmd`; on SIGUSR1, SIGTERM or SIGINT stop the workers (to_workers) or signal `cmd`
    itself (srun). Returns its exit code, 128 + N if signal N ended it."""
    print("+ " + shlex.join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.Popen(
        cmd,
        env=env,
        preexec_fn=_prepare_agent if to_workers else None,
        start_new_session=to_workers,  # out of this group: a terminal's Ctrl-C reaches us only
    )

    got: list[int] = []
    signalled: set[int] = set()

    def forward(signum: int, frame: Any) -> None:
        got.append(signum)
        print(f"lmpipe.train: got {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        if to_workers:  # now, not at the next tick: a step may be shorter than the tick
            stop_workers(proc, passed_on(got[0], to_workers=True), signalled)
        else:
            proc.send_signal(passed_on(signum, to_workers=False))

    for sig in STOP_SIGNALS:
        signal.signal(sig, forward)
    while True:
        try:
            code = proc.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        if got and to_workers:
            stop_workers(proc, passed_on(got[0], to_workers=True), signalled)
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        fromfile_prefix_chars=PREFIX,  # --config-json @FILE (lmpipe.job_params)
    )
    parser.add_argument("--config-json", help="the train rule's params (JSON, or @FILE holding it)")
    parser.add_argument("--data", type=Path, help="the data's manifest.json")
    parser.add_argument("--out", type=Path, help="the run's train/ folder")
    parser.add_argument("--init", type=Path, help="starting weights (fine-tuning)")
    parser.add_argument(
        "--replay", type=Path, help="the text replayed in fine-tuning: its tokens manifest"
    )
    parser.add_argument(
        "--eval-input", action="append", default=[], metavar="KIND=PATH",
        help="a file an evaluation during training reads, by kind (passed on to the worker)",
    )  # fmt: skip
    parser.add_argument("--worker", default=PRETRAIN_WORKER, help="the module torchrun runs")
    parser.add_argument("--wandb", help="the run's logging.wandb (JSON or @FILE); absent: off")
    parser.add_argument(
        "--fresh-start",
        action="store_true",
        help=f"move old checkpoints aside; start at step 0 (or set {FRESH_START_ENV}=1)",
    )
    parser.add_argument(
        "--node-agent", action="store_true", help="internal: run the command after -- on this node"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.node_agent:
        cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
        node, node_id = os.environ.get("SLURMD_NODENAME"), os.environ.get("SLURM_NODEID")
        gpus = os.environ.get("SLURM_GPUS_ON_NODE", "0")
        print(f"lmpipe.train: node agent on {node} (node {node_id}, {gpus} GPUs)", file=sys.stderr)
        return run_forwarding(cmd, dict(os.environ), to_workers=True)
    if not (args.config_json and args.data and args.out):
        parser.error("--config-json, --data and --out are required")
    job = TrainJob.from_json(args.config_json)
    worker_args = [
        "--config-json",
        args.config_json,
        "--data",
        str(args.data),
        "--out",
        str(args.out),
    ]
    for flag, path in (("--init", args.init), ("--replay", args.replay)):
        if path is not None:
            worker_args += [flag, str(path)]
    for kind_path in args.eval_input:
        worker_args += ["--eval-input", kind_path]
    if args.wandb:
        check_installed(job.run)
        worker_args += ["--wandb", args.wandb]
    if args.fresh_start or os.environ.get(FRESH_START_ENV, "") not in ("", "0"):
        worker_args += ["--fresh-start"]
    cmd, env = build_command(job, worker_args, args.worker)
    return run_forwarding(cmd, env, to_workers=job.launch.nodes == 1)


if __name__ == "__main__":
    sys.exit(main())
