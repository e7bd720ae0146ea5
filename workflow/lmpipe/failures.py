"""A failed job's cause, said on the console.

Snakemake reports a failed shell job as `CalledProcessError ... (check log file(s) for error
details)`; the cause sits in the job's log, for a torchrun job once a rank. The Snakefile's
`onerror` hook calls `report` with Snakemake's own log: each "Error in rule" block there names
the rule, the job id (whose start block holds the wildcards) and the job's logs. For each failed
job it prints one block: the rule, its wildcards, the first error line of its logs (a Python
exception's last line, a rank's "[rankN]:" prefix dropped) and the logs' paths. Torch-free.
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


def describe(job: FailedJob) -> str:
    what = f"{job.rule} ({job.wildcards})" if job.wildcards else job.rule
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
