"""What the rules submit: each job's SLURM resources, derived from its estimate (lmpipe.costs).

The rules ask for these (`common.smk`), so what `python -m lmpipe.plan` prints is what is
submitted. Torch-free: the Snakefile imports it at parse time.

- tokenize (and its parts): a node's CPUs (at most the cluster's largest node's under SLURM),
  its memory, a time limit from the estimate;
- convert and evaluate: for a GPU run one GPU of its kind and its share of the node's CPUs and
  memory, for a CPU run a core or two; a time limit of twice the estimate plus 10 minutes;
- train: the run's `launch:` (the train rule reads them directly), and a priority that grows with
  its FLOPs, so that a sweep's biggest point starts first.
"""

from __future__ import annotations

import math
from typing import Any

from lmpipe import config as lmconfig
from lmpipe import costs
from lmpipe.costs import tokenize_parts

__all__ = ["job_resources", "tokenize_parts", "train_priority"]


def job_resources(
    config: dict[str, Any],
    rule: str,
    run_or_dataset: str,
    evaluation: str = "",
    node_cpus: int | None = None,
) -> dict[str, Any]:
    """The resources a download, tokenize, convert or evaluate job asks for: {cpus, mem_mb,
    runtime, gres} (gres None: no GPU); a tokenize job's CPUs at most `node_cpus`, the most a
    node of the cluster has (under SLURM). `run_or_dataset`: a download_model job's model."""
    if rule == "download":
        job = costs.download_job(config, run_or_dataset)
    elif rule == "download_model":
        job = costs.download_model_job(config, run_or_dataset)
    elif rule in ("download_hellaswag", "download_suite"):
        job = costs.small_download_job(config, rule)
    elif rule == "tokenize":
        job = costs.tokenize_job(config, run_or_dataset, node_cpus=node_cpus)
    elif rule == "tokenize_part":
        job = costs.tokenize_job(config, run_or_dataset, "part", node_cpus)
    elif rule == "convert":
        job = costs.convert_job(config, run_or_dataset)
    elif rule == "evaluate":
        job = costs.eval_job(config, run_or_dataset, evaluation, None)
    else:
        raise ValueError(f"no derived resources for rule {rule!r}")
    return {"cpus": job.cpus, "mem_mb": job.mem_mb, "runtime": job.limit_min, "gres": job.gres}


def train_priority(config: dict[str, Any], run: str) -> int:
    """The runs that train longest start first (their FLOPs on a log scale), so that a sweep's
    biggest point does not start last and hold up the rest on a few cores or a small cluster."""
    rc = lmconfig.run_config(config, run)
    steps = rc.train.max_steps or costs.fine_tuning_steps(config, rc)  # fine-tuning: its epochs
    flops = costs.train_flops_per_token(rc.model, rc.train.seq_len)
    return round(10 * math.log10(1 + flops * steps * rc.train.batch_tokens))
