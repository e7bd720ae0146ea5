"""A failed job's cause, said on the console.

Snakemake reports a failed shell job as `CalledProcessError ... (check log file(s) for error
details)`; the cause sits in the job's log, for a torchrun job once a rank. The Snakefile's
`onerror` hook calls `report` with Snakemake's own log: each "Error in rule" block there names
the rule, the job id (whose start block holds the wildcards) and the job's logs. For each failed
job it prints one block: the rule, its wildcards, the first error line of its logs (a Python
exception's last line, a rank's "[rankN]:" prefix dropped) and the logs' paths. Torch-free.

A train job stopped on a signal (Ctrl-C, SLURM's SIGTERM) is no error: its rank 0 logs
`stop_line` once its checkpoint is saved, and exits EXIT_STOPPED. For such a job the hook prints
one line instead: the run, the signal and the step its checkpoint holds, and that running the same
command again resumes from it. (Snakemake calls the hook after a Ctrl-C too, once its running jobs
have ended: it waits for them.)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

# "ValueError: ...", "lmpipe.data.shards.ShardError: ...", "prog: error: ..." (argparse), each
# maybe behind torchrun's "[rank1]: " and with a message (torchrun's "ChildFailedError: " has none)
ERROR_LINE = re.compile(
    r"^(?:\[\w*?\d+\]:\s*)?\s*"
    r"((?:[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)|\S+: error): \S.*)$"
)
START = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")
FAILED = re.compile(r"^Error in rule (\S+):$")
FIELD = re.compile(r"^\s+(jobid|wildcards|log): (.*)$")
EXIT_STOPPED = 75  # EX_TEMPFAIL: a train job stopped on a signal after a checkpoint
STOPPED = re.compile(r"stopping at step (\d+) on (SIG\w+|another rank's signal)")


def stop_line(step: int, signal: str | None) -> str:
    """What rank 0 of a train job logs once the checkpoint of `step` is saved on a signal
    (`signal`: its name; None when only another rank got one), as `describe` reads it back."""
    who = signal or "another rank's signal"
    return f"stopping at step {step} on {who}; a restart resumes from there"


@dataclass
class FailedJob:
    rule: str
    jobid: str = ""
    wildcards: str = ""
    logs: list[Path] = field(default_factory=list)


def failed_jobs(snakemake_log: str) -> list[FailedJob]:
    """The jobs Snakemake's log reports as failed, with the wildcards of their start blocks."""
    wildcards: dict[str, str] = {}  # job id -> "run=..., eval=..."
    failed: list[FailedJob] = []
    block: FailedJob | None = None
    is_error = False
    for line in snakemake_log.splitlines():
        if start := START.match(line):
            block, is_error = FailedJob(start.group(1)), False
        elif error := FAILED.match(line):
            block, is_error = FailedJob(error.group(1)), True
            failed.append(block)
        elif block is not None and (f := FIELD.match(line)):
            key, value = f.groups()
            if key == "jobid":
                block.jobid = value.strip()
            elif key == "wildcards":
                wildcards[block.jobid] = value.strip()
            elif key == "log" and is_error:
                paths = value.split(" (check log")[0]
                block.logs = [Path(p.strip()) for p in paths.split(",") if p.strip()]
        elif not line.startswith(" "):
            block = None
    for job in failed:
        job.wildcards = wildcards.get(job.jobid, "")
    return failed


def first_error(logs: Iterable[Path]) -> str | None:
    """The first error line of the first log that has one."""
    for path in logs:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if m := ERROR_LINE.match(line):
                return m.group(1).strip()
    return None


def stopped_at(logs: Iterable[Path]) -> tuple[int, str] | None:
    """(step, signal) of the last stop line in the logs (`stop_line`), or None."""
    found = None
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for m in STOPPED.finditer(text):
            found = int(m.group(1)), m.group(2)
    return found


def describe(job: FailedJob) -> str:
    what = f"{job.rule} ({job.wildcards})" if job.wildcards else job.rule
    if stop := stopped_at(job.logs):
        step, signal = stop
        return (
            f"lmpipe: {what} stopped on {signal} with its checkpoint at step {step}; the same"
            " command again resumes from it"
        )
    cause = first_error(job.logs) or "no error line found in its log"
    logs = ", ".join(str(p) for p in job.logs) or "(the rule keeps no log)"
    return f"lmpipe: {what} failed\n  {cause}\n  log: {logs}"


def report(snakemake_logs: str | list[str], out: TextIO = sys.stdout) -> None:
    """Snakemake's onerror hook (its argument: its log or logs): one block a failed job. What a
    failed job leaves missing, the next run rebuilds with what reads it (lmpipe.stale)."""
    paths = [snakemake_logs] if isinstance(snakemake_logs, str) else list(snakemake_logs)
    jobs = []
    for path in paths:
        try:
            jobs += failed_jobs(Path(path).read_text(errors="replace"))
        except OSError:
            continue
    for job in jobs:
        print(describe(job), file=out)
