"""The jobs of a target as Snakemake itself plans them: its DAG, read from a dry run.

The plan (`python -m lmpipe.plan`) costs these jobs rather than a list of its own, so a rule
added to the workflow is in the plan as soon as it is in the DAG, and a rule the plan cannot
cost is an error naming it rather than a job silently left out.

    jobs = target_jobs("results/report_124m.html")   # [DagJob("download", {"dataset": ...}), ...]

`--forceall`: every job of the target, whatever already exists; `--nolock`: a plan may be made
while a run holds the working directory's lock. Torch-free; it runs Snakemake in a subprocess
(the same interpreter), so the config is checked exactly as a real run checks it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lmpipe.paths import REPO_ROOT

# a job's header in Snakemake's dry-run output: "rule train:" or "localrule download:"
JOB_HEADER = re.compile(r"^(?:local)?rule (\w+):$")
WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")


class DagError(RuntimeError):
    """Snakemake could not build the DAG of the target; the message holds its own words."""


@dataclass(frozen=True)
class DagJob:
    rule: str
    wildcards: dict[str, str] = field(default_factory=dict)


def parse_dry_run(text: str) -> list[DagJob]:
    """The jobs of a dry run's output, in the order Snakemake lists them."""
    jobs: list[DagJob] = []
    for line in text.splitlines():
        if header := JOB_HEADER.match(line):
            jobs.append(DagJob(header.group(1)))
        elif (wildcards := WILDCARDS.match(line)) and jobs:
            pairs = (pair.split("=", 1) for pair in wildcards.group(1).split(", "))
            jobs[-1].wildcards.update({key: value for key, value in pairs})
    return jobs


def target_jobs(
    target: str, configfiles: list[str] | None = None, workdir: Path = REPO_ROOT
) -> list[DagJob]:
    """Every job Snakemake would run to build `target` from nothing, with the config files
    given (merged over config/config.yaml, as `snakemake --configfile` merges them)."""
    cmd = [sys.executable, "-m", "snakemake", "--dry-run", "--forceall", "--nolock"]
    cmd += ["--snakefile", str(REPO_ROOT / "Snakefile"), "--directory", str(workdir)]
    if configfiles:
        cmd += ["--configfile", *configfiles]
    done = subprocess.run([*cmd, "--", target], capture_output=True, text=True)
    if done.returncode != 0:
        last = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise DagError(f"snakemake could not plan {target}: " + " | ".join(last[-3:]))
    jobs = parse_dry_run(done.stdout)
    if not jobs and "Nothing to be done" not in done.stdout:
        raise DagError(f"snakemake's dry run of {target} listed no job: {done.stdout[-300:]}")
    return jobs
