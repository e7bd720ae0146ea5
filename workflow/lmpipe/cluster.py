"""What a SLURM cluster's partitions can hold, read from `sinfo`, and whether a job fits one.

A job that no node of its partition can hold (16 CPUs on nodes of 2, 8 GPUs on nodes of 4, a
time limit over the partition's) is queued all the same and pends for good (PartitionConfig,
PartitionTimeLimit, ...): the Snakefile asks this module before it submits anything, and the plan
(`python -m lmpipe.plan --cluster`) before a person does.

    cluster = read_cluster()                       # sinfo, one line a partition's node kind
    ask = Ask(cpus=16, mem_mb=4000)                # what a job asks a node for
    cluster.refusal(ask, "debug")                  # None, or why no partition holds it

A job goes to the partition it names (`-p`, `SBATCH_PARTITION`); one that names none to the
default partition (sinfo's `*`), as sbatch sends it. A partition holds a job when enough of its
nodes, whatever their state, each have the CPUs, memory and GPUs (of the type asked) the job asks
a node for, the job's nodes are within the partition's largest job, and its time within the
partition's limit. Down or drained nodes count: they may come back, and a job that waits for them
is said by the pending watch (lmpipe.pending). Torch-free.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# one line a partition's nodes of one configuration and state (--exact: never "2+" for mixed
# nodes); the fields NodeGroup.parse reads, in this order
SINFO_FORMAT = "%P|%a|%l|%s|%D|%c|%m|%G|%T"
SINFO_COMMAND = ["sinfo", "--exact", "--noheader", f"--format={SINFO_FORMAT}"]


class ClusterError(ValueError):
    """sinfo could not be run or read; the message names the command or the line."""


def slurm_minutes(text: str) -> float:
    """SLURM's time (`infinite`, `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`) in
    minutes; math.inf for no limit."""
    if text.lower() in ("infinite", "unlimited", "n/a"):
        return math.inf
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        raise ValueError(f"not a SLURM time: {text!r}")
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        h, m, s = int(a), int(b or 0), int(c or 0)
    elif c is not None:  # HH:MM:SS
        h, m, s = int(a), int(b), int(c)
    else:  # MM[:SS]
        h, m, s = 0, int(a), int(b or 0)
    return (int(days or 0) * 24 + h) * 60 + m + s / 60


def gres_gpus(item: str) -> tuple[str, int]:
    """One GRES item as (GPU type, count): `gpu` (1, untyped), `gpu:8`, `gpu:a100`, `gpu:a100:8`;
    ("", 0) for another kind of GRES."""
    name, *rest = re.sub(r"\(.*\)$", "", item.strip()).split(":")  # `(S:0-1)`: sockets
    if name != "gpu" or len(rest) > 2:
        return "", 0
    if not rest:
        return "", 1
    if len(rest) == 1:
        return ("", int(rest[0])) if rest[0].isdigit() else (rest[0], 1)
    return rest[0], int(rest[1])


def node_gpus(gres: str) -> dict[str, int]:
    """A node's GPUs by type ("" untyped) from sinfo's GRES: `gpu:2`, `gpu:a100:8(S:0-1)`,
    `gpu:a100:4(S:0),gpu:v100:2(S:1)`, `(null)`."""
    gpus: dict[str, int] = {}
    for item in re.split(r",(?![^()]*\))", gres):  # the commas outside a socket list
        kind, count = gres_gpus(item)
        if count:
            gpus[kind] = gpus.get(kind, 0) + count
    return gpus


def job_nodes(size: str) -> float:
    """The largest job a partition takes, nodes, from sinfo's `1-infinite`, `1-16`, `16`."""
    top = size.split("-")[-1]
    return math.inf if top.lower() in ("infinite", "unlimited") else int(top)


@dataclass(frozen=True)
class NodeGroup:
    """One sinfo line: a partition's nodes of one configuration and state."""

    partition: str
    default: bool  # the partition a job naming none goes to
    available: str  # the partition's state: up, down, drain, inact
    time_limit: float  # the partition's, minutes (math.inf: none)
    max_job_nodes: float  # the partition's largest job, nodes (math.inf: any)
    count: int  # nodes
    cpus: int  # a node's
    mem_mb: int  # a node's
    gpus: dict[str, int]  # a node's, by type ("" untyped)
    state: str

    @classmethod
    def parse(cls, line: str) -> NodeGroup:
        fields = line.strip().split("|")
        if len(fields) != len(SINFO_FORMAT.split("|")):
            raise ClusterError(f"sinfo line {line.strip()!r}: not of the format {SINFO_FORMAT}")
        name, avail, limit, size, count, cpus, mem, gres, state = fields
        try:
            return cls(
                partition=name.rstrip("*"), default=name.endswith("*"), available=avail,
                time_limit=slurm_minutes(limit), max_job_nodes=job_nodes(size),
                count=int(count), cpus=int(cpus.rstrip("+")), mem_mb=int(mem.rstrip("+")),
                gpus=node_gpus(gres), state=state,
            )  # fmt: skip
        except ValueError as e:
            raise ClusterError(f"sinfo line {line.strip()!r}: {e}") from None

    def gpus_of(self, kind: str | None) -> int:
        """A node's GPUs of a type (None: any type)."""
        return sum(self.gpus.values()) if kind is None else self.gpus.get(kind, 0)


def plural(n: float, word: str) -> str:
    return f"{n:g} {word}{'s' * (n != 1)}"


def fmt_gb(mem_mb: float) -> str:
    return f"{mem_mb / 1000:g} GB"


def fmt_minutes(limit: float) -> str:
    return "no time limit" if limit == math.inf else f"{limit:g} min"


def fmt_gpus(count: int, kind: str | None) -> str:
    if not count:
        return "no GPU"
    return plural(count, "GPU") + (f" ({kind})" if kind else "")


@dataclass(frozen=True)
class Ask:
    """What a job asks SLURM for: a node's CPUs, memory and GPUs, its nodes and time."""

    cpus: int = 1
    mem_mb: int = 0
    gpus: int = 0
    gpu_type: str | None = None  # None: any type
    nodes: int = 1
    minutes: float = 0.0  # 0: the partition's default

    def __str__(self) -> str:
        time = f", {self.minutes:g} min" if self.minutes else ""
        return (
            f"{plural(self.cpus, 'CPU')}, {fmt_gb(self.mem_mb)} and"
            f" {fmt_gpus(self.gpus, self.gpu_type)} a node, {plural(self.nodes, 'node')}{time}"
        )

    @classmethod
    def of_resources(cls, resources: Mapping[str, Any], threads: int) -> Ask:
        """A Snakemake job's ask, as snakemake-executor-plugin-slurm turns its resources into
        sbatch's: `cpus_per_task` (else its threads) a task, `tasks` spread over `nodes`,
        `mem_mb` a node (or `mem_mb_per_cpu`), `gres` a node or `gpu` (+ `gpu_model`) in all,
        `runtime` minutes."""

        def number(key: str, default: int = 0) -> int:
            value = resources.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else default

        nodes = max(1, number("nodes", 1))
        tasks_a_node = max(1, math.ceil(number("tasks", 1) / nodes))
        cpus = max(1, number("cpus_per_task") or threads) * tasks_a_node
        mem = number("mem_mb") or number("mem_mb_per_cpu") * cpus
        kind, gpus = gres_gpus(str(resources.get("gres") or ""))
        if not gpus and number("gpu"):  # --gpus: the job's, over its nodes
            kind, gpus = resources.get("gpu_model") or "", math.ceil(number("gpu") / nodes)
        return cls(cpus, mem, gpus, kind or None, nodes, number("runtime"))


@dataclass
class Partition:
    name: str
    groups: list[NodeGroup] = field(default_factory=list)

    @property
    def default(self) -> bool:
        return self.groups[0].default

    def shortfalls(self, ask: Ask) -> list[str]:
        """What of `ask` this partition cannot give, in a few words each (empty: it holds it)."""
        first, short = self.groups[0], []
        if ask.minutes > first.time_limit:
            short.append("a time over its limit")
        if ask.nodes > first.max_job_nodes:
            short.append(f"more nodes than its largest job ({first.max_job_nodes:g})")
        holding = sum(
            g.count for g in self.groups
            if g.cpus >= ask.cpus and g.mem_mb >= ask.mem_mb and g.gpus_of(ask.gpu_type) >= ask.gpus
        )  # fmt: skip
        if holding >= ask.nodes:
            return short
        most, per_node = self.most(), []
        if ask.cpus > most.cpus:
            per_node.append("too many CPUs")
        if ask.mem_mb > most.mem_mb:
            per_node.append("too much memory")
        if ask.gpus > max(g.gpus_of(ask.gpu_type) for g in self.groups):
            per_node.append(f"no node has {fmt_gpus(ask.gpus, ask.gpu_type)}")
        if not per_node:  # each alone is there, but not on enough nodes together
            per_node.append(f"{holding} of its nodes hold it, not {ask.nodes}")
        return short + per_node

    def most(self) -> NodeGroup:
        """The most of each thing a node of this partition has (not always the same node)."""
        g = self.groups
        return NodeGroup(
            self.name, self.default, g[0].available, g[0].time_limit, g[0].max_job_nodes,
            sum(x.count for x in g), max(x.cpus for x in g), max(x.mem_mb for x in g),
            {k: max(x.gpus.get(k, 0) for x in g) for x in g for k in x.gpus}, "",
        )  # fmt: skip

    def gpu_kinds(self) -> str:
        gpus = self.most().gpus
        return ", ".join(fmt_gpus(n, k or "untyped") for k, n in sorted(gpus.items())) or "no GPU"

    def offer(self) -> str:
        """The most it offers, in words."""
        most = self.most()
        return (
            f"at most {plural(most.cpus, 'CPU')}, {fmt_gb(most.mem_mb)} and {self.gpu_kinds()}"
            f" a node, {plural(most.count, 'node')}, {fmt_minutes(most.time_limit)}"
        )


@dataclass
class Cluster:
    """The partitions sinfo lists, by name."""

    partitions: dict[str, Partition]

    @classmethod
    def parse(cls, text: str) -> Cluster:
        """sinfo's output, as SINFO_COMMAND prints it."""
        partitions: dict[str, Partition] = {}
        for line in text.splitlines():
            if line.strip():
                group = NodeGroup.parse(line)
                partition = partitions.setdefault(group.partition, Partition(group.partition))
                partition.groups.append(group)
        if not partitions:
            raise ClusterError(f"sinfo lists no partition ({' '.join(SINFO_COMMAND)})")
        return cls(partitions)

    def candidates(self, partition: str | None) -> list[Partition]:
        """Where a job goes: the partition it names, else the default (every one where sinfo
        marks none)."""
        if partition:
            if partition not in self.partitions:
                raise ClusterError(
                    f"partition {partition!r}, which sinfo does not list (it lists"
                    f" {', '.join(self.partitions)})"
                )
            return [self.partitions[partition]]
        default = [p for p in self.partitions.values() if p.default]
        return default or list(self.partitions.values())

    def node_cpus(self, partition: str | None) -> int:
        """The most CPUs a node of the partition a job goes to has."""
        return max(p.most().cpus for p in self.candidates(partition))

    def holder(self, ask: Ask, partition: str | None) -> str | None:
        """The partition a job goes to, where it holds the job; None where none does."""
        return next((p.name for p in self.candidates(partition) if not p.shortfalls(ask)), None)

    def refusal(self, ask: Ask, partition: str | None) -> str | None:
        """Why the partition a job goes to cannot hold it, naming the partitions that could;
        None where it can."""
        if self.holder(ask, partition):
            return None
        where = self.candidates(partition)
        why = "; ".join(
            f"partition {p.name}{' (the default)' if p.default and not partition else ''} has"
            f" {p.offer()}: {', '.join(p.shortfalls(ask))}"
            for p in where
        )
        others = [
            p.name for p in self.partitions.values() if p not in where and not p.shortfalls(ask)
        ]
        if len(others) == 1:
            fix = f"partition {others[0]} holds it (SBATCH_PARTITION={others[0]})"
        elif others:
            fix = f"partitions {', '.join(others)} hold it (SBATCH_PARTITION)"
        else:
            fix = "no partition of this cluster holds it: ask for less"
        return f"asks {ask}; {why}; {fix}"


def read_cluster(command: list[str] = SINFO_COMMAND) -> Cluster:
    """The cluster's partitions as sinfo lists them now."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ClusterError(f"{' '.join(command)}: {e}") from None
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return Cluster.parse(done.stdout)
