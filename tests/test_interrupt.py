"""Ctrl-C on `snakemake --cores 2` while a run trains, as a terminal sends it: SIGINT to the
whole foreground process group (Snakemake, the job's shell `exec`ing the launcher; torchrun and
its workers run in sessions of their own).

The train job saves a checkpoint at the step it reached, says so in its log in at most 3 lines
(no tracebacks), and fails; Snakemake's console names the run and the step; the same command again
resumes from that checkpoint and ends with the weights and losses of a run never interrupted
(`ref`, the same settings under another name: the run's name is no part of its trajectory).
A Ctrl-C after the last step lets the job finish during Snakemake's wait, which leaves its output
marked incomplete: the workflow profile's `rerun-incomplete` makes the same command rerun it.

Real processes throughout: Snakemake, the launcher, torchrun, 2 FSDP ranks on gloo, DCP files.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from test_train import load_final, losses, metrics

from conftest import default_stop_signals, make_workdir, snakemake

pytestmark = pytest.mark.slow

STEPS = 60
TRAIN = {
    "seq_len": 32,
    "micro_batch": 2,
    "batch_tokens": 128,  # 2 ranks x 2 rows x 32 tokens: one micro-step
    "max_steps": STEPS,
    "optimizer": {"name": "adamw", "lr": 3.0e-3},
    "schedule": {"warmup_steps": 2},
    "val_every": 0,
    "val_tokens": 256,
    "checkpoint_every": 1000,  # none on the way: the one saved is the signal's (and the last)
}
RUNS = ("sig", "late", "ref")  # the same settings
STEP_LINE = re.compile(r"^step +\d+/\d+ \| ")  # a training step's line (llm.c's)
TOKENS = "results/data/embedded/tokens/manifest.json"


def final(run: str) -> str:
    return f"results/runs/{run}/train/final"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the workflow with three tiny runs of the same settings, its tokens made."""
    wd = make_workdir(tmp_path_factory.mktemp("interrupt"))
    path = wd / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    for run in RUNS:
        config["runs"][run] = {
            "dataset": "embedded", "model": "tiny-xs", "train": TRAIN,
            "launch": {"device": "cpu", "procs_per_node": 2},
        }  # fmt: skip
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    snakemake(wd, "--cores", "2", TOKENS)
    return wd


@pytest.fixture(scope="module")
def reference(workdir: Path) -> Path:
    """`ref` trained without interruption."""
    snakemake(workdir, "--cores", "2", final("ref"))
    return workdir / "results/runs/ref/train"


def ctrl_c(workdir: Path, run: str, when: Callable[[list[dict]], bool]) -> dict:
    """`snakemake --cores 2 <run's final/>` in a session of its own, as a terminal runs it, and
    Ctrl-C once the run's metrics satisfy `when`: SIGINT to the whole process group. Returns
    Snakemake's exit code and console, and the train log's lines written after the signal."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    console = workdir / f"console-{run}.txt"
    train_log = workdir / f"results/logs/train/{run}.log"
    out = workdir / f"results/runs/{run}/train"
    with open(console, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "snakemake", "--cores", "2", final(run)], cwd=workdir,
            env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=default_stop_signals,
        )  # fmt: skip
    try:
        deadline = time.time() + 300
        while not ((out / "metrics.jsonl").exists() and when(metrics(out))):
            assert proc.poll() is None and time.time() < deadline, console.read_text()[-3000:]
            time.sleep(0.01)
        before = len(train_log.read_text().splitlines())
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    after = train_log.read_text().splitlines()[before:]
    return {"rc": proc.returncode, "console": console.read_text(), "log_after": after}


def assert_same_run(out: Path, reference: Path) -> None:
    """Every step's loss and the final weights, bit for bit."""
    assert [m["step"] for m in metrics(out) if "loss" in m] == list(range(1, STEPS + 1))
    assert losses(out) == losses(reference)
    got, want = load_final(out), load_final(reference)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_ctrl_c_saves_the_step_says_so_and_the_same_command_resumes_bit_for_bit(
    workdir: Path, reference: Path
) -> None:
    out = workdir / "results/runs/sig/train"
    stopped = ctrl_c(workdir, "sig", lambda lines: len([m for m in lines if "loss" in m]) >= 3)
    assert stopped["rc"] != 0, stopped["console"][-3000:]  # not taken for done

    # the checkpoint at the step reached, the only one; no final weights
    (saved,) = (out / "checkpoints").glob("step_*")
    step = int(saved.name.removeprefix("step_"))
    assert 3 <= step < STEPS and not (out / "final").exists()
    assert losses(out)[-1] == metrics(out)[-1]["loss"] and len(losses(out)) == step
    end = json.loads((out / "attempts.jsonl").read_text().splitlines()[-1])
    assert end == end | {"event": "end", "step": step, "how": "signal", "signal": "SIGINT"}

    # the train log: the launcher's line, rank 0's save and stop; no traceback
    said = [line for line in stopped["log_after"] if not STEP_LINE.match(line)]
    print("\nthe lines the Ctrl-C added to the train log:", *said, sep="\n  ")
    assert len(said) <= 3, said
    assert said[0] == "lmpipe.train: got SIGINT", said
    assert said[-1].endswith(f"stopping at step {step} on SIGINT; a restart resumes from there")
    log = (workdir / "results/logs/train/sig.log").read_text()
    for noise in ("Traceback", "KeyboardInterrupt", "SignalException", "ChildFailedError"):
        assert noise not in log, log

    # the console names the run and the step
    line = (
        f"lmpipe: train (run=sig) stopped on SIGINT with its checkpoint at step {step}; the same"
        " command again resumes from it"
    )
    assert line in stopped["console"].splitlines(), stopped["console"][-3000:]

    # the same command again resumes and ends as the uninterrupted run
    snakemake(workdir, "--cores", "2", final("sig"))
    resumed = (workdir / "results/logs/train/sig.log").read_text()
    assert f"resumed from results/runs/sig/train/checkpoints/step_{step:06d}" in resumed
    assert_same_run(out, reference)


def test_a_job_finished_during_the_ctrl_c_wait_is_rerun_by_the_same_command(
    workdir: Path, reference: Path
) -> None:
    """Ctrl-C after the last step: the job writes final/ while Snakemake waits for it, and
    Snakemake, no longer recording ends, leaves final/ marked incomplete. The same command
    (the workflow profile's rerun-incomplete) reruns the job, which resumes from the last
    step's checkpoint; without it, Snakemake stops with IncompleteFilesException."""
    out = workdir / "results/runs/late/train"
    late = ctrl_c(workdir, "late", lambda lines: any(m.get("step") == STEPS for m in lines))
    assert "lmpipe.train: got SIGINT" in late["log_after"], late["log_after"]  # while it ran
    assert (out / "final").exists(), late["console"][-3000:]
    end = json.loads((out / "attempts.jsonl").read_text().splitlines()[-1])
    assert end == end | {"event": "end", "step": STEPS, "how": "finished"}

    rerun = snakemake(workdir, "--cores", "2", final("late"), check=False)
    console = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, console[-3000:]
    assert "IncompleteFilesException" not in console and "localrule train:" in console
    resumed = (workdir / "results/logs/train/late.log").read_text()
    assert f"resumed from results/runs/late/train/checkpoints/step_{STEPS:06d}" in resumed
    assert_same_run(out, reference)
