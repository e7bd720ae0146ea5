"""The cluster's partitions from sinfo (lmpipe.cluster), whether a job fits one, the pending
reasons that never clear (lmpipe.pending), and the plan's check against a saved sinfo.

The SLURM runs of the same checks (a job refused before submission, tokenize sized to the
nodes, a pending job named on the console) are in tests/test_slurm.py."""

from __future__ import annotations

import math
import re

import pytest

from conftest import CONFIG_FILE
from lmpipe import plan
from lmpipe.cluster import Ask, Cluster, ClusterError, slurm_minutes
from lmpipe.pending import PendingWatch, job_comment, parse_squeue, what_to_do

# `sinfo --exact --noheader --format=%P|%a|%l|%s|%D|%c|%m|%G|%T` on the test cluster of
# tests/slurm/setup.sh (SLURM 22.05.8, nodes n1 and n2 of 2 CPUs, 16000 MB, 2 untyped GPUs):
# idle, then with a job on n1 and n2 drained
LOCAL_IDLE = "debug*|up|infinite|1-infinite|2|2|16000|gpu:2|idle\n"
LOCAL_BUSY = (
    "debug*|up|infinite|1-infinite|1|2|16000|gpu:2|drained\n"
    "debug*|up|infinite|1-infinite|1|2|16000|gpu:2|allocated\n"
)
# by hand, in sinfo's forms: typed GPUs with their sockets, two types on a node, a day limit, a
# largest job, a partition without GPUs
SITE = """\
gpu*|up|2-00:00:00|1-8|12|32|256000|gpu:a100:4(S:0-1)|mix
gpu*|up|2-00:00:00|1-8|4|32|256000|gpu:a100:4(S:0),gpu:v100:2(S:1)|idle
h100|up|12:00:00|1-2|2|96|1024000|gpu:h100:8(S:0-1)|idle
cpu|up|infinite|1-infinite|64|128|512000|(null)|alloc
"""


@pytest.mark.parametrize("sinfo", [LOCAL_IDLE, LOCAL_BUSY])
def test_the_local_clusters_sinfo_is_one_default_partition_of_two_nodes(sinfo):
    cluster = Cluster.parse(sinfo)
    assert list(cluster.partitions) == ["debug"]
    (debug,) = cluster.candidates(None)
    assert debug.default and sum(g.count for g in debug.groups) == 2
    most = debug.most()
    assert (most.cpus, most.mem_mb, most.gpus, most.time_limit) == (2, 16000, {"": 2}, math.inf)
    assert cluster.node_cpus(None) == 2


def test_gpu_types_sockets_and_limits_are_read():
    cluster = Cluster.parse(SITE)
    gpu, h100, cpu = (cluster.partitions[n] for n in ("gpu", "h100", "cpu"))
    assert gpu.default and not h100.default and not cpu.default
    assert [g.gpus for g in gpu.groups] == [{"a100": 4}, {"a100": 4, "v100": 2}]
    assert gpu.groups[0].time_limit == 48 * 60 and gpu.groups[0].max_job_nodes == 8
    assert h100.groups[0].time_limit == 12 * 60 and h100.groups[0].max_job_nodes == 2
    assert cpu.groups[0].gpus == {} and cpu.groups[0].max_job_nodes == math.inf
    assert cluster.node_cpus(None) == 32  # the default partition's
    assert cluster.node_cpus("cpu") == 128


@pytest.mark.parametrize(
    "text, minutes",
    [("infinite", math.inf), ("30", 30), ("30:00", 30), ("4:00:00", 240), ("1-00:00:00", 1440),
     ("2-12", 3600), ("1-01:30", 1530)],
)  # fmt: skip
def test_slurm_times(text, minutes):
    assert slurm_minutes(text) == minutes


def test_a_line_of_another_format_is_an_error_naming_it():
    with pytest.raises(ClusterError, match=r"sinfo line 'debug\*\|up\|infinite'"):
        Cluster.parse("debug*|up|infinite\n")
    with pytest.raises(ClusterError, match="sinfo line .*'soon'"):
        Cluster.parse("debug*|up|soon|1-infinite|2|2|16000|gpu:2|idle")
    with pytest.raises(ClusterError, match="no partition"):
        Cluster.parse("\n")


def test_16_cpus_on_nodes_of_2_are_refused_naming_both():
    why = Cluster.parse(LOCAL_IDLE).refusal(Ask(cpus=16, mem_mb=4000, minutes=30), None)
    assert why.startswith("asks 16 CPUs, 4 GB and no GPU a node, 1 node, 30 min;")
    assert "partition debug (the default) has at most 2 CPUs, 16 GB" in why
    assert "too many CPUs" in why and "too much memory" not in why
    assert "no partition of this cluster holds it" in why
    assert Cluster.parse(LOCAL_IDLE).refusal(Ask(cpus=2, mem_mb=16000, gpus=2), None) is None


def test_the_124m_node_is_refused_by_a_cluster_of_4_gpu_nodes_and_another_partition_named():
    cluster = Cluster.parse(SITE)
    ask = Ask(cpus=64, mem_mb=480000, gpus=8, nodes=1, minutes=240)  # the 124m preset's launch
    why = cluster.refusal(ask, None)
    assert "partition gpu (the default) has at most 32 CPUs, 256 GB and 4 GPUs (a100)" in why
    assert "too many CPUs, too much memory, no node has 8 GPUs" in why
    assert why.endswith("partition h100 holds it (SBATCH_PARTITION=h100)")
    assert cluster.refusal(ask, "h100") is None and cluster.holder(ask, "h100") == "h100"
    # the type asked: 2 v100 on 4 nodes of the default partition, 3 a100 on all 16
    assert cluster.holder(Ask(gpus=2, gpu_type="v100", nodes=4), None) == "gpu"
    assert "4 of its nodes hold it, not 5" in cluster.refusal(
        Ask(gpus=2, gpu_type="v100", nodes=5), None
    )
    assert "no node has 1 GPU (h100)" in cluster.refusal(Ask(gpus=1, gpu_type="h100"), None)


def test_time_and_nodes_over_the_partitions_limits_are_refused():
    cluster = Cluster.parse(SITE)
    assert "a time over its limit" in cluster.refusal(Ask(gpus=8, minutes=13 * 60), "h100")
    assert "more nodes than its largest job (2)" in cluster.refusal(Ask(nodes=3), "h100")
    assert cluster.refusal(Ask(minutes=10**6), "cpu") is None  # infinite


def test_a_partition_that_does_not_exist_is_named_with_those_that_do():
    with pytest.raises(
        ClusterError, match="partition 'gpus', which sinfo does not list .*gpu, h100"
    ):
        Cluster.parse(SITE).refusal(Ask(), "gpus")


def test_a_snakemake_jobs_resources_are_read_as_the_slurm_plugin_submits_them():
    train = {"nodes": 2, "tasks": 2, "cpus_per_task": 64, "mem_mb": 480000,
             "gres": "gpu:a100:8", "runtime": 240, "tasks_per_gpu": 0}  # fmt: skip
    assert Ask.of_resources(train, threads=8) == Ask(64, 480000, 8, "a100", 2, 240)
    tokenize = {"mem_mb": 4000, "runtime": 30, "_cores": 16}
    assert Ask.of_resources(tokenize, threads=16) == Ask(16, 4000, 0, None, 1, 30)
    per_cpu = {"mem_mb_per_cpu": 1000, "gpu": 4, "gpu_model": "h100", "nodes": 2}
    assert Ask.of_resources(per_cpu, threads=3) == Ask(3, 3000, 2, "h100", 2, 0)


# ---- pending reasons ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    ["PartitionConfig", "PartitionTimeLimit", "PartitionNodeLimit", "BadConstraints",
     "QOSMaxWallDurationPerJobLimit", "AssocMaxCpuPerJobLimit", "QOSMaxGRESPerNode",
     "InvalidAccount", "InvalidQOS", "ReqNodeNotAvail, UnavailableNodes:n[1-2]", "JobHeldUser"],
)  # fmt: skip
def test_reasons_that_never_clear(reason):
    assert "42" in what_to_do(reason, "42")


@pytest.mark.parametrize(
    "reason",
    ["Resources", "Priority", "None", "Dependency", "BeginTime", "AssocGrpCpuLimit",
     "QOSMaxJobsPerUserLimit", "AssocMaxJobsLimit", "ReqNodeNotAvail, UnavailableNodes:",
     "PartitionConfigs"],
)  # fmt: skip
def test_reasons_that_clear_by_themselves(reason):
    assert what_to_do(reason, "42") is None


def test_a_job_pending_for_good_is_said_once_after_two_polls():
    queue = ["7|rule_tokenize_wildcards_embedded|PartitionConfig\n8|rule_report|Priority\n"]
    said: list[str] = []
    watch = PendingWatch(lambda: queue[0], {"rule_tokenize_wildcards_embedded": "rule t"}.get,
                         said.append)  # fmt: skip
    assert watch.poll() == []  # seen once: SLURM sets some reasons for a moment
    (line,) = watch.poll()
    assert line.startswith("lmpipe: SLURM job 7 of rule t pends for PartitionConfig, which")
    assert "scancel 7" in line and said == [line]
    assert watch.poll() == []  # said once
    queue[0] = "9|x|Resources\n"
    assert watch.poll() == [] and watch.poll() == []


def test_a_reason_seen_once_is_not_said():
    queue = ["7|c|ReqNodeNotAvail, UnavailableNodes:n1\n", "7|c|Resources\n"]
    watch = PendingWatch(lambda: queue.pop(0), str, print)
    assert watch.poll() == [] and watch.poll() == []


def test_a_failing_squeue_is_said_once():
    def broken() -> str:
        raise OSError("squeue: error: slurm_load_jobs error: Unable to contact slurm controller")

    said: list[str] = []
    watch = PendingWatch(broken, str, said.append)
    watch.poll(), watch.poll()
    assert len(said) == 1 and "could not read squeue: squeue: error" in said[0]


def test_a_jobs_comment_is_the_one_the_slurm_plugin_submits_it_with():
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.utils import get_job_wildcards

    for values in (["slurm/lr=1e-3"], ["embedded-a", "val_loss"], []):
        job = SimpleNamespace(wildcards=values)
        plugins = f"rule_train_wildcards_{get_job_wildcards(job)}" if values else "rule_train"
        assert job_comment("train", values) == plugins


def test_squeue_lines_keep_a_reasons_commas():
    (job,) = parse_squeue("12|rule_train_wildcards_a|ReqNodeNotAvail, UnavailableNodes:n[1-2]\n")
    assert (job.job_id, job.comment) == ("12", "rule_train_wildcards_a")
    assert job.reason == "ReqNodeNotAvail, UnavailableNodes:n[1-2]"


# ---- the plan against a saved sinfo ------------------------------------------------------------


def test_the_plan_names_the_124m_jobs_a_cluster_of_4_gpu_nodes_cannot_hold(
    tmp_path, capsys, monkeypatch
):
    """The 124m preset (8 GPUs, 64 CPUs, 480 GB a node) against SITE's default partition: its
    train job holds nowhere but in h100's, and its tokenize job asks at most a node's 32 CPUs;
    the download is a job of one CPU on the partition LMPIPE_DOWNLOAD_PARTITION names."""
    monkeypatch.setenv("LMPIPE_DOWNLOAD_PARTITION", "cpu")
    sinfo = tmp_path / "sinfo.txt"
    sinfo.write_text(SITE)
    args = ["results/report_124m.html", "--config", str(CONFIG_FILE), "--sinfo", str(sinfo)]
    assert plan.main(args) == 1
    out = capsys.readouterr().out
    rows = {line[3:].split("  ")[0]: line for line in out.splitlines() if line[3:].strip()}
    assert re.search(r"^!! train 124m .*  none  ", rows["train 124m"])
    assert re.search(r"  32 CPU, 4 GB  .*  gpu  ", rows["tokenize fineweb10B"])
    assert re.search(r"  1 CPU, 8 GB  .*  cpu  ", rows["download fineweb10B"])
    problem = [line for line in out.splitlines() if line.startswith("!! train 124m: ")]
    assert len(problem) == 1
    assert "asks 64 CPUs, 480 GB and 8 GPUs a node, 1 node, 240 min" in problem[0]
    assert problem[0].endswith("partition h100 holds it (SBATCH_PARTITION=h100)")
    # on the partition that holds them, every job fits
    assert plan.main([*args, "--partition", "h100"]) == 0
    assert "every job fits its time limit and its partition" in capsys.readouterr().out
