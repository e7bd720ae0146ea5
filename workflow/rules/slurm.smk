# Under the slurm executor (`--profile slurm`): jobs sized to the cluster's nodes, a job that no
# partition can hold refused before anything is submitted, and a submitted job that pends for a
# reason that never clears named on the console (lmpipe.cluster, lmpipe.pending).
#
# The executor is Snakemake's own `workflow.executor_plugin`, set before the DAG is built: `slurm`
# in the main process that submits, `slurm-jobstep` in the Snakemake each job runs on its node
# (which parses this file again), `dryrun` under -n. Nothing here runs sinfo or squeue but the
# main process; the CPUs it sized the jobs with reach the jobs in LMPIPE_NODE_CPUS (sbatch
# exports the environment), so the Snakemake on the node computes the same threads.

import functools

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from lmpipe import cluster as lmcluster
from lmpipe import pending as lmpending

NODE_CPUS_ENV = "LMPIPE_NODE_CPUS"


def on_slurm():
    """Whether this is the main process of a run under the slurm executor: the one that
    submits."""
    plugin = workflow.executor_plugin
    return plugin is not None and plugin.name == "slurm" and workflow.is_main_process


@functools.cache
def slurm_cluster():
    """The cluster's partitions, read once a run (lmpipe.cluster)."""
    try:
        return lmcluster.read_cluster()
    except lmcluster.ClusterError as e:
        raise WorkflowError(f"lmpipe: the cluster's partitions: {e}") from None


def get_node_cpus():
    """The most CPUs a node has in the partition the jobs go to (SBATCH_PARTITION, else the
    default): what a tokenize job asks for at most. None (no cap) off SLURM; Snakemake scales a
    local job's threads down to --cores itself."""
    if on_slurm():
        partition = os.environ.get("SBATCH_PARTITION") or None
        try:
            cpus = slurm_cluster().node_cpus(partition)
        except lmcluster.ClusterError as e:
            raise WorkflowError(f"lmpipe: SBATCH_PARTITION names {e}") from None
        # for the jobs' own Snakemake (sbatch --export)
        os.environ[NODE_CPUS_ENV] = str(cpus)
        return cpus
    if not workflow.is_main_process and os.environ.get(NODE_CPUS_ENV):
        return int(os.environ[NODE_CPUS_ENV])
    return None


def job_label(job):
    """`tokenize (dataset=embedded)`: a Snakemake job's rule and wildcards."""
    wildcards = ", ".join(f"{k}={v}" for k, v in job.wildcards_dict.items())
    return f"{job.rule.name} ({wildcards})" if wildcards else job.rule.name


def slurm_jobs():
    """The jobs this run will submit: those that need to run, the local rules left out."""
    return [job for job in workflow.dag.needrun_jobs() if not job.is_local]


def check_jobs_fit():
    """Stops the run, before any sbatch, on a job that the partition it goes to cannot hold:
    one line a job, naming what it asks and what the partition has. LMPIPE_CLUSTER_CHECK=0
    turns it off (a cluster whose sinfo does not show what its jobs get)."""
    if os.environ.get("LMPIPE_CLUSTER_CHECK") == "0":
        return
    refused = []
    for job in slurm_jobs():
        ask = lmcluster.Ask.of_resources(job.resources, job.threads)
        try:
            why = slurm_cluster().refusal(ask, job.resources.get("slurm_partition"))
        except lmcluster.ClusterError as e:  # a partition it names that does not exist
            why = f"names {e}"
        if why:
            refused.append(f"lmpipe: rule {job_label(job)} {why}")
    if refused:
        # said as lines, not as an exception (whose traceback would bury them), and the run
        # ends with exit status 1 before the scheduler starts: nothing is submitted
        for line in refused:
            logger.error(line)
        logger.error(
            "lmpipe: nothing submitted; lower a rule's ask (--set-threads, --set-resources, a"
            " run's launch: settings) or set SBATCH_PARTITION"
        )
        raise SystemExit(1)


def watch_pending(every_s=15.0):
    """A daemon thread that names this run's jobs pending for a reason that never clears."""
    jobs = slurm_jobs()
    if not jobs:
        return
    # the plugin names each job of the run after the run's id
    run_name = workflow.scheduler.get_executor(jobs[0]).run_uuid
    labels = {
        lmpending.job_comment(job.rule.name, job.wildcards): f"rule {job_label(job)}"
        for job in jobs
    }
    command = lmpending.squeue_command(run_name)
    lmpending.PendingWatch(
        query=lambda: lmpending.run_squeue(command),
        label=lambda comment: labels.get(comment, f"comment {comment}"),
        say=logger.warning,
        every_s=every_s,
    ).start()


def slurm_onstart():
    """The Snakefile's onstart hook (after the DAG, before the first submission; never in a
    job, whose Snakemake runs with --no-hooks)."""
    if on_slurm():
        check_jobs_fit()
        watch_pending()
