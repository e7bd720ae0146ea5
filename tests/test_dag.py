"""lmpipe.dag: the jobs of a target read from Snakemake's own dry run."""

from __future__ import annotations

import pytest

from lmpipe.dag import DagError, DagJob, parse_dry_run, target_jobs

# an excerpt of `snakemake --dry-run --forceall` (Snakemake 9.27), as printed
DRY_RUN = """\
Building DAG of jobs...
Job stats:
job          count
---------  -------
download         1
evaluate         2
total            3

[Wed Dec  2 11:00:37 2026]
localrule download:
    output: results/data/fineweb10B/raw/manifest.json
    jobid: 3
    reason: Forced execution
    wildcards: dataset=fineweb10B
    resources: tmpdir=/tmp
[Wed Dec  2 11:00:37 2026]
rule download_suite:
    output: results/data/eval_suite/manifest.json
    resources: tmpdir=/tmp
[Wed Dec  2 11:00:37 2026]
rule evaluate:
    output: results/runs/lr/lr=6e-4_model=d12/eval/val_loss.json
    wildcards: run=lr/lr=6e-4_model=d12, eval=val_loss
This was a dry-run (flag -n). The order of jobs does not reflect the order of execution.
"""


def test_a_dry_runs_jobs_are_read_with_their_wildcards():
    assert parse_dry_run(DRY_RUN) == [
        DagJob("download", {"dataset": "fineweb10B"}),
        DagJob("download_suite", {}),
        DagJob("evaluate", {"run": "lr/lr=6e-4_model=d12", "eval": "val_loss"}),
    ]


def test_the_embedded_reports_jobs_come_from_snakemake(tmp_path):
    from conftest import make_workdir

    jobs = target_jobs("results/report_embedded.html", workdir=make_workdir(tmp_path))
    rules = {job.rule for job in jobs}
    assert {"download", "tokenize", "train", "convert", "evaluate", "report"} <= rules
    evals = {job.wildcards["eval"] for job in jobs if job.rule == "evaluate"}
    assert {"val_loss", "hellaswag", "suite"} <= evals
    assert not (tmp_path / "results").exists()  # a dry run writes no result


def test_a_target_snakemake_cannot_plan_is_an_error_in_its_words(tmp_path):
    from conftest import make_workdir

    with pytest.raises(DagError, match="report_nosuch"):
        target_jobs("results/report_nosuch.html", workdir=make_workdir(tmp_path))
