"""Missing or half-written outputs are rebuilt, and so is what reads them.

Snakemake decides a job is up to date when its outputs exist and are newer than its inputs, even
when one of those inputs is gone: it takes the missing file for a temporary one that was cleaned
up (snakemake/snakemake#1978). So a file removed by hand, by a disk cleaner or by a scratch purge
leaves every file made from it, the report included, silently stale: "Nothing to be done".

Here, once Snakemake has built the DAG of a target and before it decides what to run, every job of
that DAG is looked at:

- an output that is missing while a job that reads it has all its own outputs on disk, and
- an output that is there but half-written (a manifest whose listed files are not all there, an
  empty output folder)

each get their producing job forced, with the same mechanism as `--forcerun FILE`; Snakemake then
reruns what follows that job, as it does after any rerun. One line each says so on the console.
Snakemake's own markers handle an output its job was killed while writing (`rerun-incomplete`,
profiles/default/config.yaml).

`find` is the rule, on plain data (torch-free and Snakemake-free, so pytest covers it); `install`
hooks it into Snakemake's DAG from the Snakefile.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from lmpipe import manifests

MANIFEST = manifests.MANIFEST


@dataclass(frozen=True)
class Job:
    """A job as this check sees it: a name to print, its output and input files, and which of
    its outputs are temporary (Snakemake's `temp()`: removed once read, on purpose)."""

    name: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    temporary: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Repair:
    """A job to force, and why: its output `path` is missing (read by `readers`) or half-written."""

    job: Job
    path: str
    problem: str  # "missing" or what is wrong with it
    readers: tuple[Job, ...] = ()

    def line(self) -> str:
        if self.readers:
            read_by = ", ".join(r.outputs[0] if r.outputs else r.name for r in self.readers)
            why = f"{self.path} is {self.problem}, and {read_by}, which reads it, is on disk"
        else:
            why = f"{self.path} is {self.problem}"
        return f"lmpipe: {why}: {self.job.name} rebuilds it, then what reads it reruns"


def listed(manifest: dict) -> list[str]:
    """The files and folders a manifest lists beside itself: its `shards` and `files` (tokens,
    raw text, conversations: {"file": name}), a tokens manifest's `token_bytes` table and its
    `tasks`' folders (the evaluation suite)."""
    entries = [e for key in ("shards", "files") for e in manifest.get(key) or []]
    entries += [manifest.get("token_bytes")]  # a tokens manifest's byte table
    names = [e.get("file") for e in entries if isinstance(e, dict)]
    tasks = manifest.get("tasks")
    if isinstance(tasks, dict):
        names += [t.get("folder") for t in tasks.values() if isinstance(t, dict)]
    return [n for n in names if isinstance(n, str)]


def half_written(path: str) -> str | None:
    """What is wrong with an output that is there but not whole, or None when it looks whole:
    an empty folder, or a manifest whose listed files are not all there. Cheap: names only,
    never contents (the readers check those, and name the file)."""
    p = Path(path)
    if p.is_dir():
        return None if any(p.iterdir()) else "an empty folder"
    if p.name != MANIFEST or not p.is_file():
        return None
    try:
        manifest = manifests.read_object(p, "manifest")
    except manifests.ManifestNotFound:
        return None
    except (OSError, manifests.ManifestError):
        return "not readable JSON"
    for name in listed(manifest):
        if not (p.parent / name).exists():
            return f"half-written ({name}, which it lists, is missing)"
    return None


def find(
    jobs: Iterable[Job],
    exists: Callable[[str], bool] = os.path.exists,
    broken: Callable[[str], str | None] = half_written,
) -> list[Repair]:
    """The jobs to force, one Repair an output: an output that is missing while a job reading it
    has all its outputs on disk, or one that is on disk but half-written."""
    jobs = list(jobs)
    producer = {path: job for job in jobs for path in job.outputs}
    present = {job: bool(job.outputs) and all(map(exists, job.outputs)) for job in jobs}
    readers: dict[str, list[Job]] = {}
    for job in jobs:
        for path in job.inputs:
            if path in producer and present[job]:
                readers.setdefault(path, []).append(job)
    repairs = []
    for path, job in producer.items():
        if path in job.temporary:
            continue
        if not exists(path):
            if path in readers:
                repairs.append(Repair(job, path, "missing", tuple(readers[path])))
        elif problem := broken(path):
            repairs.append(Repair(job, path, problem))
    return repairs


def _job(job) -> Job:
    """A Snakemake job as `find` takes it."""
    from snakemake.io import is_flagged

    wildcards = ", ".join(f"{k}={v}" for k, v in job.wildcards_dict.items())
    name = f"{job.rule.name} ({wildcards})" if wildcards else job.rule.name
    temporary = frozenset(str(f) for f in job.output if is_flagged(f, "temp"))
    return Job(name, tuple(map(str, job.output)), tuple(map(str, job.input)), temporary)


def install(workflow, say: Callable[[str], None] | None = None) -> None:
    """Run `find` on every DAG this `workflow` builds in its main process (not inside a job,
    which builds a DAG of its own one job), after the jobs are known and before Snakemake
    decides which need to run, and force the repairs' jobs. The hook is Snakemake's DAG step
    that forces incomplete files under --rerun-incomplete (`DAG.check_incomplete`, 9.x)."""
    from snakemake.dag import DAG
    from snakemake.logging import logger

    say = say or logger.warning
    check_incomplete = getattr(DAG, "check_incomplete", None)
    if check_incomplete is None or getattr(check_incomplete, "lmpipe_stale", False):
        if check_incomplete is None:
            say("lmpipe: this Snakemake has no DAG.check_incomplete: missing outputs not repaired")
        return

    async def check_incomplete_then_repair(dag) -> None:
        await check_incomplete(dag)
        if dag.workflow is not workflow or not workflow.is_main_process:
            return
        by_job = {_job(job): job for job in dag.jobs}
        for repair in find(by_job):
            say(repair.line())
            dag.forcefiles.update(by_job[repair.job].output)

    check_incomplete_then_repair.lmpipe_stale = True
    DAG.check_incomplete = check_incomplete_then_repair
