"""A submitted SLURM job that pends for a reason that never clears by itself, said on the console.

Snakemake's slurm executor only sees PENDING: a job asking more than its partition allows
(PartitionConfig), a time over its limit (PartitionTimeLimit), an account it may not use
(InvalidAccount) waits for ever with no word. The Snakefile starts a `PendingWatch` (a daemon
thread of the main process, under the slurm executor only) that asks squeue for this run's
pending jobs (the plugin names every job after the run's id) and, for a job whose reason is one
of `NEVER_CLEARS`, says one line: the SLURM job id, the rule and wildcards, the reason and what
to do. A reason is said once a job, and only once two polls in a row have seen it: SLURM sets
some of them for a moment (ReqNodeNotAvail while its backfill scheduler runs).

The reasons are SLURM's job reason codes (slurm.schedmd.com/job_reason_codes.html): those of a
request the partition, its QOS or the association can never grant (a per-job or per-node limit,
not an aggregate one such as AssocGrp* or QOSMaxJobsPerUserLimit, which clear as other jobs end),
an account or QOS the job may not use, a hold, and nodes or a partition that are down (only their
admins bring them back). Torch-free.
"""

from __future__ import annotations

import getpass
import re
import subprocess
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

SQUEUE_FORMAT = "%i|%k|%r"  # job id, comment (the plugin's rule_<rule>_wildcards_<values>), reason

# Snakemake submits a cancelled job again (--retries): the run is what to stop
STOP = "stop the run (Ctrl-C: Snakemake cancels its jobs; a `scancel {job}` alone is retried)"
TOO_BIG = (
    STOP + ", then ask for what the partition allows (--set-threads, --set-resources, a run's"
    " launch:) or another partition (SBATCH_PARTITION)"
)
NOT_ALLOWED = STOP + ", then set an account or QOS the partition takes (SBATCH_ACCOUNT)"
DOWN = (
    "the nodes or partition it needs are down: wait for the admins, or " + STOP + " and use"
    " another partition (SBATCH_PARTITION)"
)
# (the reason's start, what to do); ReqNodeNotAvail only with nodes that are down, drained or not
# responding (squeue lists them as UnavailableNodes), not for nodes in use or reserved
NEVER_CLEARS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"(?:{p})(?!\w)"), hint)
    for p, hint in (
        (r"Partition(?:Config|TimeLimit|NodeLimit)|BadConstraints|MaxMemPerLimit", TOO_BIG),
        (r"(?:QOS|Assoc)Max\w*Per(?:Job|Node)\w*|QOSMin\w+", TOO_BIG),
        (r"InvalidAccount|InvalidQOS|AccountNotAllowed|QOSNotAllowed", NOT_ALLOWED),
        (r"ReqNodeNotAvail, UnavailableNodes:\S+|NodeDown|FrontEndDown", DOWN),
        (r"PartitionDown|PartitionInactive", DOWN),
        (r"JobHeld(?:User|Admin)", "scontrol release {job}, or scancel {job}"),
        (r"DependencyNeverSatisfied", "scancel {job}: what it waits for failed"),
    )
]


def what_to_do(reason: str, job: str) -> str | None:
    """What to do about a job pending for `reason` (squeue's %r, e.g. `PartitionConfig`,
    `ReqNodeNotAvail, UnavailableNodes:n1`); None for a reason that clears by itself
    (Resources, Priority, AssocGrpCpuLimit, ...)."""
    for pattern, hint in NEVER_CLEARS:
        if pattern.match(reason.strip()):
            return hint.format(job=job)
    return None


@dataclass(frozen=True)
class PendingJob:
    job_id: str
    comment: str
    reason: str


def parse_squeue(text: str) -> list[PendingJob]:
    """squeue's lines in SQUEUE_FORMAT (a reason may hold `|`-free commas and colons)."""
    jobs = []
    for line in text.splitlines():
        if line.strip():
            job_id, comment, reason = line.strip().split("|", 2)
            jobs.append(PendingJob(job_id, comment, reason))
    return jobs


def job_comment(rule: str, wildcard_values: Iterable[Any]) -> str:
    """The comment snakemake-executor-plugin-slurm gives a job it submits (`rule_<rule>`, then
    `_wildcards_` and the values joined by `_`, a `/` as `_`): how a line of squeue is matched to
    its rule and wildcards."""
    values = "_".join(str(v) for v in wildcard_values).replace("/", "_")
    return f"rule_{rule}" + (f"_wildcards_{values}" if values else "")


def squeue_command(run_name: str) -> list[str]:
    """This user's pending jobs named `run_name` (the plugin's run id)."""
    return [
        "squeue", "--noheader", f"--user={getpass.getuser()}", "--states=PENDING",
        f"--name={run_name}", f"--format={SQUEUE_FORMAT}",
    ]  # fmt: skip


class PendingWatch:
    """Polls `query` (squeue's output) every `every_s` seconds and `say`s a line for each job
    pending for a reason that never clears, named by `label(comment)` ("rule tokenize
    (dataset=embedded)")."""

    def __init__(
        self,
        query: Callable[[], str],
        label: Callable[[str], str],
        say: Callable[[str], None],
        every_s: float = 15.0,
    ):
        self.query, self.label, self.say, self.every_s = query, label, say, every_s
        self.last: dict[str, str] = {}  # job id -> its reason at the last poll
        self.said: set[str] = set()
        self.failure = ""
        self.stop = threading.Event()

    def poll(self) -> list[str]:
        """One look at the queue: the lines said."""
        try:
            jobs = parse_squeue(self.query())
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            if str(e) != self.failure:  # said once, not every poll
                self.failure = str(e)
                self.say(f"lmpipe: the pending-job watch could not read squeue: {e}")
            return []
        lines = []
        for job in jobs:
            hint = what_to_do(job.reason, job.job_id)
            if hint and self.last.get(job.job_id) == job.reason and job.job_id not in self.said:
                self.said.add(job.job_id)
                lines.append(
                    f"lmpipe: SLURM job {job.job_id} of {self.label(job.comment)} pends for"
                    f" {job.reason}, which never clears by itself: {hint}"
                )
        self.last = {job.job_id: job.reason for job in jobs}
        for line in lines:
            self.say(line)
        return lines

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.poll()

    def start(self) -> threading.Thread:
        """The watch on a daemon thread: it ends with Snakemake."""
        thread = threading.Thread(target=self.run, name="lmpipe-pending-watch", daemon=True)
        thread.start()
        return thread


def run_squeue(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise OSError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout
