"""The plan of a target before a single job is submitted, for people: every job's resources, time,
disk, GPU-hours and cost.

    python -m lmpipe.plan results/report_124m.html              # the 124M report's jobs
    python -m lmpipe.plan results/report_350m.html --gpu h100   # estimates for H100s
    python -m lmpipe.plan results/report_124m.html --cluster    # against this cluster's sinfo

The jobs are Snakemake's own: its DAG of the target, from a dry run (lmpipe.dag), so the plan
never restates the workflow. Each job is costed by its rule's function below (`RULE_COSTS`, over
lmpipe.costs); a rule without one stops the plan naming it. The resources printed are those the
rules submit (lmpipe.resources derives them from the same estimates). With `--cluster` (or
`--sinfo FILE`, a saved sinfo) each job is checked against the partitions as `--profile slurm`
checks it before it submits (lmpipe.cluster): the partition that holds it, or a problem naming
what it asks and what the partition has. `report_plan` is the part the report shows beside each
run's measured figures.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmpipe import config as lmconfig
from lmpipe import costs
from lmpipe.cluster import SINFO_COMMAND, Ask, Cluster, ClusterError, gres_gpus, read_cluster
from lmpipe.costs import DOWNLOAD_PARTITION_ENV, Job
from lmpipe.dag import DagJob, target_jobs
from lmpipe.hardware import GPU_BF16_PEAK
from lmpipe.paths import REPO_ROOT
from lmpipe.registry import EVALUATIONS
from lmpipe.throughputs import THROUGHPUTS

# ----------------------------------------------------------------------------------------------
# a job of the DAG, costed by its rule


def export_llmc_job(config: dict[str, Any], run: str) -> Job:
    """A CPU job of one core (the rule asks for no GPU): the weights read, llm.c's file written."""
    job = costs.convert_job(config, run)
    job.rule, job.gpus, job.cpus, job.gpu, job.gres = "export_llmc", 0, 1, "", None
    job.disk_bytes /= 2
    return job


def data_name(w: dict[str, str]) -> str:
    """A data job's name: its dataset, and the model whose tokens it writes (`*_for_model`)."""
    return "/".join(w[k] for k in ("dataset", "model") if k in w)


def mixture_job(rule: str, w: dict[str, str]) -> Job:
    return Job(rule, data_name(w), "", estimate_s=5, basis="local rule: the sources' manifest")


def conversations_job(rule: str, w: dict[str, str]) -> Job:
    return Job(rule, data_name(w), "cpu", mem_mb=8000, estimate_s=60, limit_min=120)


# rule -> function(config, its wildcards, the GPU asked for, the most CPUs a node has or None)
# -> its Job; the profile's default resources (slurm/config.yaml: 8 GB, 2 hours) where a rule
# asks for no others
RULE_COSTS: dict[str, Callable[[dict[str, Any], dict[str, str], str | None, int | None], Job]] = {
    "download": lambda c, w, gpu, cpus: costs.download_job(c, w["dataset"]),
    "download_hellaswag": lambda c, w, gpu, cpus: costs.small_download_job(c, "download_hellaswag"),
    "download_suite": lambda c, w, gpu, cpus: costs.small_download_job(c, "download_suite"),
    "tokenize_part": lambda c, w, gpu, cpus: costs.tokenize_job(
        c, w["dataset"], f"{w['dataset']}/{w['part']}", cpus
    ),
    "tokenize": lambda c, w, gpu, cpus: costs.tokenize_job(c, w["dataset"], node_cpus=cpus),
    # a model's own tokenizer: estimated at GPT-2's measured rate (its own is not measured)
    "tokenize_for_model": lambda c, w, gpu, cpus: costs.tokenize_job(
        c, w["dataset"], node_cpus=cpus
    ),
    # a BPE trained on one thread, at the rate measured on the embedded sample
    "train_tokenizer": lambda c, w, gpu, cpus: costs.train_tokenizer_job(c, w["tokenizer"]),
    "mixture": lambda c, w, gpu, cpus: mixture_job("mixture", w),
    "mixture_for_model": lambda c, w, gpu, cpus: mixture_job("mixture_for_model", w),
    "prepare_conversations": lambda c, w, gpu, cpus: conversations_job("prepare_conversations", w),
    "prepare_conversations_for_model": lambda c, w, gpu, cpus: conversations_job(
        "prepare_conversations_for_model", w
    ),
    "train": lambda c, w, gpu, cpus: costs.train_job(c, w["run"], gpu),
    "download_model": lambda c, w, gpu, cpus: costs.download_model_job(c, w["model"]),
    "convert": lambda c, w, gpu, cpus: costs.convert_job(c, w["run"], gpu),
    "reference": lambda c, w, gpu, cpus: Job(
        "reference",
        w["run"],
        "cpu",
        mem_mb=1000,
        estimate_s=5,
        limit_min=15,
        basis="links the model's files (no copy)",
    ),  # fmt: skip
    "export_llmc": lambda c, w, gpu, cpus: export_llmc_job(c, w["run"]),
    "evaluate": lambda c, w, gpu, cpus: costs.eval_job(c, w["run"], w["eval"], gpu),
    # tokenizing the tasks' text: the whole suite (its 11 tasks, MMLU's 14,042 items) in GPT-2's
    # tokens took 8 s on one core here (`python -m lmpipe.eval.task_bytes`, 2026-12-07)
    "task_bytes": lambda c, w, gpu, cpus: Job(
        "task_bytes",
        f"{w['text']}/{w['tokens']}",
        "cpu",
        mem_mb=2000,
        estimate_s=10,
        limit_min=15,
        basis="measured: the whole suite in GPT-2's tokens, 8 s on one core",
    ),  # fmt: skip
    "report": lambda c, w, gpu, cpus: Job(
        "report", w["report"], "cpu", mem_mb=8000, estimate_s=60, limit_min=120
    ),
}
RULE_ORDER = list(RULE_COSTS)  # the stages in the order they run


class PlanError(ValueError):
    """A job the plan cannot cost; the message names its rule."""


def cost_jobs(
    config: dict[str, Any],
    jobs: list[DagJob],
    gpu: str | None = None,
    node_cpus: int | None = None,
) -> list[Job]:
    """Each of the DAG's `jobs` costed, in the order the stages run (a tokenize job on at most
    `node_cpus` CPUs, as under SLURM); a job whose estimate is over its time limit is flagged."""
    unknown = sorted({job.rule for job in jobs if job.rule not in RULE_COSTS})
    if unknown:
        raise PlanError(
            f"rule(s) {', '.join(unknown)}: no cost in lmpipe.plan.RULE_COSTS; add one there"
        )
    ordered = sorted(jobs, key=lambda job: RULE_ORDER.index(job.rule))
    planned = [RULE_COSTS[job.rule](config, job.wildcards, gpu, node_cpus) for job in ordered]
    for job in planned:
        flag_over_limit(config, job)
    return planned


def flag_over_limit(config: dict[str, Any], job: Job) -> None:
    max_runtime = config["cluster"]["max_runtime"]
    if job.rule != "train" and job.limit_min is not None and job.estimate_s > job.limit_min * 60:
        job.problems.append(
            f"estimated {fmt_time(job.estimate_s)}, over its time limit of {job.limit_min} min"
            + (" (the partition's cluster.max_runtime)" if job.limit_min == max_runtime else "")
        )


def job_ask(job: Job) -> Ask:
    """What a costed job asks SLURM for, as the rules submit it."""
    kind, gpus = gres_gpus(job.gres or "")
    return Ask(job.cpus, job.mem_mb, gpus, kind or None, job.nodes, job.limit_min or 0)


def check_cluster(jobs: list[Job], cluster: Cluster, partition: str | None) -> list[str]:
    """The partition that holds each job ("local" for a local rule, "none" where none does: the
    reason is added to its problems). The download jobs go to LMPIPE_DOWNLOAD_PARTITION where
    it is set (slurm/config.yaml)."""
    where = []
    for job in jobs:
        goes_to = partition
        if job.rule.startswith("download"):
            goes_to = os.environ.get(DOWNLOAD_PARTITION_ENV) or partition
        if job.device == "":
            where.append("local")
        elif holder := cluster.holder(job_ask(job), goes_to):
            where.append(holder)
        else:
            job.problems.append(cluster.refusal(job_ask(job), goes_to) or "")
            where.append("none")
    return where


def report_plan(config: dict[str, Any], report: str) -> str:
    """What the report shows beside each run's measured figures: its training's estimate (JSON,
    the report rule's params)."""
    price = config["reports"][report]["gpu_hour_price"]
    runs = {}
    for run in config["reports"][report]["runs"]:
        if lmconfig.is_reference(config, run):
            continue  # measured, never trained: no training to estimate
        job = costs.train_job(config, run, None)
        hour_price = costs.gpu_hour_price(price, job.gpu) if job.gpus else None
        runs[run] = {
            "train_s": job.estimate_s,
            "gpu_hours": job.gpu_hours if job.gpus else None,
            "gpu": job.gpu or None,
            "cost": None if hour_price is None else job.gpu_hours * hour_price,
            "gpu_mem_gb": job.gpu_mem_gb,
            "jobs_in_a_row": job.jobs_in_a_row,
            "basis": job.basis,
            "problems": job.problems,
        }
    return lmconfig.canonical_json(runs)


# ----------------------------------------------------------------------------------------------
# printing


def fmt_time(seconds: float) -> str:
    if seconds == math.inf:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def fmt_bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n / 1e3:.3g} kB" if n else "—"


def job_row(j: Job) -> tuple[str, ...]:
    """A job's line of the table: what it asks for, its estimate, limit, disk, GPU-hours."""
    if j.device == "":
        res = "local rule"
    elif j.gpus:
        res = f"{j.gpus} GPU, {j.nodes} node, {j.cpus} CPU, {j.mem_mb // 1000} GB"
    else:
        res = f"{j.cpus} CPU, {j.mem_mb // 1000} GB"
    limit = "—" if j.limit_min is None else f"{j.limit_min} min"
    if j.rule == "train" and j.jobs_in_a_row > 1:
        limit += f" x{j.jobs_in_a_row}"
    return (
        f"{j.rule} {j.name}".strip(), res, fmt_time(j.estimate_s), limit, fmt_bytes(j.disk_bytes),
        f"{j.gpu_hours:.1f}" if j.gpus else "—",
        f"{j.gpu_mem_gb:.0f} GB" if j.gpu_mem_gb else "—", j.basis,
    )  # fmt: skip


def cost_line(jobs: list[Job], price: float | dict[str, float]) -> str:
    """The GPU-hours' cost at each GPU type's price ("no price" for a type the mapping lacks)."""
    hours: dict[str, float] = {}
    for j in jobs:
        if j.gpus:
            hours[j.gpu] = hours.get(j.gpu, 0.0) + j.gpu_hours
    if not hours:
        return "no GPU-hours"
    parts, total = [], 0.0
    for gpu, h in hours.items():
        p = costs.gpu_hour_price(price, gpu)
        if p is None:
            parts.append(f"{h:.1f} on {gpu} at no price (add it to the report's gpu_hour_price)")
        else:
            total += h * p
            parts.append(f"{h:.1f} on {gpu} at ${p:g}/GPU-hour")
    return f"about ${total:,.0f}: " + "; ".join(parts)


CPU_SLOW_S = 30 * 60  # an evaluation of a CPU run estimated over this gets a word in the plan


def slow_on_cpu(jobs: list[Job]) -> list[str]:
    """A line for each evaluation of a CPU run estimated over CPU_SLOW_S: the evaluations'
    defaults are sized for GPU runs (llm.c's 10M val tokens, all of HellaSwag)."""
    return [
        f"evaluate {j.name}: about {fmt_time(j.estimate_s)} on the CPU; a smaller"
        f" eval.{EVALUATIONS[j.name.split('/')[-1]].section} (tokens, items) finishes sooner"
        for j in jobs
        if j.rule == "evaluate" and j.device == "cpu" and j.estimate_s > CPU_SLOW_S
    ]


def format_plan(
    jobs: list[Job],
    price: float | dict[str, float],
    report: str,
    where: list[str] | None = None,
) -> str:
    """The table, a job a row (with `where`, the partition that holds each), and the totals and
    problems under it."""
    head = ("job", "resources", "estimate", "limit", "disk", "GPU-h", "GPU mem", "basis")
    rows = [job_row(j) for j in jobs]
    if where is not None:  # the partition before the basis, which is long
        head = (*head[:-1], "partition", head[-1])
        rows = [(*r[:-1], w, r[-1]) for r, w in zip(rows, where, strict=True)]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["   " + "  ".join(c.ljust(w) for c, w in zip(head, widths, strict=True)).rstrip()]
    for job, row in zip(jobs, rows, strict=True):
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        lines.append(("!! " if job.problems else "   ") + line)
    gpu_hours = sum(j.gpu_hours for j in jobs)
    disk = sum(j.disk_bytes for j in jobs)
    lines.append("")
    lines.append(
        f"report {report}: {len(jobs)} jobs, {gpu_hours:.1f} GPU-hours, {fmt_bytes(disk)} on"
        f" disk; {cost_line(jobs, price)}"
    )
    problems = [(j, p) for j in jobs for p in j.problems]
    for job, problem in problems:
        lines.append(f"!! {job.rule} {job.name}: {problem}")
    if not problems:
        lines.append("every job fits its time limit" + " and its partition" * (where is not None))
    lines += [f"note: {slow}" for slow in slow_on_cpu(jobs)]
    lines.append(f"(throughputs: {THROUGHPUTS.relative_to(REPO_ROOT)}; GPU memory: a rough"
                 " upper bound, lmpipe.costs.gpu_memory_gb)")  # fmt: skip
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("target", help="results/report_NAME.html (or the report's name)")
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--configfile", nargs="*", default=[], help="overlays, as snakemake's")
    p.add_argument(
        "--gpu", metavar="NAME[=PEAK]",
        help="estimate for this GPU (default: each run's gpu_model, or a100); PEAK: its dense"
        " bf16 FLOP/s, for a GPU lmpipe.hardware does not know (e.g. rtx4090=165e12)",
    )  # fmt: skip
    p.add_argument("--price", type=float, help="USD per GPU-hour (default: the report's)")
    p.add_argument(
        "--cluster", action="store_true",
        help="check each job against this cluster's partitions (sinfo), as --profile slurm"
        " does before it submits; tokenize on at most a node's CPUs",
    )  # fmt: skip
    p.add_argument(
        "--sinfo", metavar="FILE", type=Path,
        # (argparse formats help with %: sinfo's own format fields are doubled)
        help="as --cluster, from a saved `" + " ".join(SINFO_COMMAND).replace("%", "%%") + "`",
    )  # fmt: skip
    p.add_argument(
        "--partition", default=os.environ.get("SBATCH_PARTITION") or None,
        help="the partition the jobs go to (default: $SBATCH_PARTITION, else the default one)",
    )  # fmt: skip
    return p


def load_cluster(args: argparse.Namespace) -> Cluster | None:
    """The cluster to check the jobs against: --sinfo's file, --cluster's sinfo, or none."""
    if args.sinfo:
        return Cluster.parse(args.sinfo.read_text())
    return read_cluster() if args.cluster else None


def main(argv: list[str] | None = None) -> int:
    from lmpipe import schema  # the config check needs Snakemake; the rules' path does not

    p = parser()
    args = p.parse_args(argv)
    if args.gpu and "=" in args.gpu:
        name, peak = args.gpu.split("=", 1)
        try:
            GPU_BF16_PEAK[name.lower()], args.gpu = float(peak), name
        except ValueError:
            p.error(f"--gpu {args.gpu}: PEAK must be a number of FLOP/s (e.g. {name}=165e12)")
    config = schema.load_config(args.config, args.configfile)
    match = re.fullmatch(r"(?:.*/)?report_(.+)\.html", args.target)
    report = match.group(1) if match else args.target
    if report not in config["reports"]:
        p.error(f"no report {report!r} in {args.config} (reports: {', '.join(config['reports'])})")
    files = [str(Path(f).resolve()) for f in [args.config, *args.configfile]]
    dag = target_jobs(lmconfig.layout(config).report(report), files, Path.cwd())
    try:
        cluster = load_cluster(args)
        node_cpus = cluster.node_cpus(args.partition) if cluster else None
        jobs = cost_jobs(config, dag, args.gpu, node_cpus)
    except (costs.UnknownGPU, ClusterError, OSError) as e:
        p.exit(2, f"lmpipe.plan: {e}\n")
    where = check_cluster(jobs, cluster, args.partition) if cluster else None
    price = config["reports"][report]["gpu_hour_price"] if args.price is None else args.price
    print(format_plan(jobs, price, report, where))
    return 1 if any(j.problems for j in jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
