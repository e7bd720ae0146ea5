"""The workflow as Snakemake sees it: lint, planning offline, real runs of the data stages."""

from __future__ import annotations

import json
import re

import pytest

from conftest import make_workdir, snakemake
from lmpipe.data import shards


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("wf"))


def test_lint_is_clean(workdir):
    proc = snakemake(workdir, "--lint", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


def test_plans_the_full_124m_dag_offline(workdir):
    env_hint = "no network is used: planning reads only the config and the rule files"
    proc = snakemake(workdir, "results/report_124m.html", "-n", "--quiet", "rules")
    out = proc.stdout + proc.stderr
    planned = {
        "download": 1, "tokenize": 1, "train": 1, "convert": 1, "export_llmc": 1, "report": 1,
        "download_hellaswag": 1, "download_suite": 1,
        "download_model": 1, "reference": 1,  # the reference run gpt2-openai: no train, convert
        # val_loss, hellaswag, hellaswag_lm_eval, samples, suite, suite_lm_eval, each of 2 runs
        "evaluate": 12,
    }  # fmt: skip
    for rule, count in planned.items():
        assert re.search(rf"^{rule}\s+{count}$", out, re.M), (
            f"{rule} not planned ({env_hint}):\n{out}"
        )


def test_plans_the_speedrun_report_on_8_gpus_through_the_profile(workdir):
    """The second recipe at 124M: `--profile slurm -n` plans speedrun-124m's train job on one
    node of 8 GPUs, beside the 124m run its report compares it with; no job's resources are left
    to be determined (`<TBD>`)."""
    out = snakemake(workdir, "--profile", "slurm", "-n", "results/report_speedrun-124m.html").stdout
    jobs = re.findall(r"^rule train:\n(?:\s+.*\n)*?\s+wildcards: run=(\S+)\n(?:\s+.*\n)*?"
                      r"\s+resources: (.*)$", out, re.M)  # fmt: skip
    resources = dict(jobs)
    assert set(resources) == {"speedrun-124m", "124m"}, out[-3000:]
    for run in resources:
        assert "gres=gpu:8" in resources[run] and "nodes=1" in resources[run], resources[run]
    assert "runtime=60" in resources["speedrun-124m"]
    assert "<TBD>" not in out and "disk_mb=1000" in out


def test_the_longest_training_is_scheduled_first(workdir):
    """The sweep demo's biggest point (7x the FLOPs of the next) must not start last on 2 cores:
    train jobs have a priority that grows with their training FLOPs."""
    out = snakemake(workdir, "results/report_sweep-embedded.html", "-n").stdout
    jobs = re.findall(
        r"^rule train:\n(?:\s+.*\n)*?\s+wildcards: run=(\S+)\n\s+priority: (\d+)", out, re.M
    )
    priority = {run: int(p) for run, p in jobs}
    ladder = [f"embedded/lr=3e-3_model={m}" for m in ("tiny-xs", "tiny-s", "tiny", "tiny-l")]
    assert [priority[r] for r in ladder] == sorted({priority[r] for r in ladder}), priority
    assert len(priority) == 6, out[-2000:]


@pytest.mark.parametrize("flags", [["-p"], ["--profile", "slurm"]])
def test_a_dry_run_prints_each_jobs_params_file_not_its_json(workdir, flags):
    """`-n -p`, and the slurm profile's printshellcmds (no SLURM needed to plan): the train,
    evaluate and report commands name their params' file (`--config-json @results/params/...`)
    instead of holding the JSON (the default report's was a 5,308-character line), and the dry
    run writes none of those files."""
    targets = ["results/report_embedded.html", "results/report_sweep-embedded.html"]
    proc = snakemake(workdir, "-n", *flags, *targets)
    lines = (proc.stdout + proc.stderr).splitlines()
    commands = [line for line in lines if line.startswith("Shell command: ")]
    stages = {"lmpipe.train", "lmpipe.eval", "lmpipe.report"}
    named = [c for c in commands if any(f"python -m {stage} " in c for stage in stages)]
    assert len(named) > 40, "\n".join(commands[:5])  # 9 runs: trains, evaluations, 2 reports
    assert all(re.search(r"--config-json @results/params/\w+\.json ", c) for c in named)
    assert max(len(c) for c in commands) < 400, max(commands, key=len)
    # the long lines left are Snakemake's own lists of a report's inputs (their length grows
    # with the runs and evaluations): file names, no JSON
    long = [line for line in lines if len(line) >= 400]
    assert all(line.lstrip().startswith(("input:", "reason:")) for line in long), long[:1]
    assert not any('{"' in line for line in long), max(long, key=len)[:300]
    files = {f for c in named for f in re.findall(r"@(results/params/\w+\.json)", c)}
    assert files and not any((workdir / f).exists() for f in files)


def test_invalid_config_stops_before_any_job(tmp_path):
    """A misspelt key stops a real run (no -n) with one line naming its YAML path, the key and
    the nearest one, and no job starts: nothing under results/, no job in Snakemake's log. The
    target is the cheapest job (copying the embedded data), so a run that goes on fails fast."""
    workdir = make_workdir(tmp_path / "wf")  # its own copy: no other test's results/
    bad = tmp_path / "bad.yaml"
    text = (workdir / "config" / "config.yaml").read_text()
    assert text.index("max_steps: 19073") > text.index("  124m:")  # the 124m run's, first
    bad.write_text(text.replace("max_steps: 19073", "max_step: 19073", 1))
    target = "results/data/embedded/raw/manifest.json"
    proc = snakemake(workdir, target, "--cores", "1", "--configfile", str(bad), check=False,
                     timeout=120)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    line = (
        "runs.124m.train: unknown key 'max_step' (did you mean 'max_steps'?)"
        "  [python -m lmpipe.schema --print shows every key]"
    )
    assert line in out.splitlines(), out
    assert "ConfigError" in out and "additionalProperties" not in out and len(out) < 1500, out
    assert not (workdir / "results").exists(), out  # no output, no job log
    log = "".join(f.read_text() for f in (workdir / ".snakemake" / "log").glob("*.log"))
    assert line in log.splitlines()  # the run's own log: the error and no job
    assert not re.search(r"^(local)?rule |^Finished job|^Select jobs", log, re.M), log


def test_data_stages_run_for_real_then_nothing_to_do(workdir):
    manifest = "results/data/embedded/tokens/manifest.json"
    snakemake(workdir, "--cores", "2", manifest)
    m = json.loads((workdir / manifest).read_text())
    assert m["documents"] == 1000 and m["shards"][0]["split"] == "val"
    for s in m["shards"]:
        assert (
            shards.read_header(workdir / "results/data/embedded/tokens" / s["file"]) == s["tokens"]
        )
    assert (workdir / "results/logs/tokenize/embedded.log").exists()
    # a second call with nothing changed runs nothing
    proc = snakemake(workdir, "--cores", "2", manifest)
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_jobs_run_under_snakemakes_python_whatever_path_holds(tmp_path):
    """The installed `snakemake`, started by its path from a shell whose PATH has no venv on it
    (a fresh login, a cluster job): its jobs still run under the venv's interpreter, not the
    machine's `python` (which lacks the pipeline's packages, or does not exist)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    workdir = make_workdir(tmp_path / "wf")
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(
        p for p in ("/usr/local/bin", "/usr/bin", "/bin") if Path(p).is_dir()
    )
    manifest = (
        "results/data/embedded/tokens/manifest.json"  # download + tokenize: tiktoken, pyarrow
    )
    proc = subprocess.run(
        [str(venv_bin / "snakemake"), "--cores", "1", manifest],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((workdir / manifest).read_text())["documents"] == 1000


def test_a_failed_jobs_cause_is_said_once_on_the_console(tmp_path):
    """A truncated shard fails the train job on both ranks: the console names the rule, the run,
    the shard's message (once) and the log; the log holds each rank's traceback once."""
    workdir = make_workdir(tmp_path / "wf")
    tokens = workdir / "results/data/embedded/tokens"
    snakemake(workdir, "--cores", "1", "results/data/embedded/tokens/manifest.json")
    shard = tokens / "embedded_train_000001.bin"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 50_000)
    proc = snakemake(workdir, "--cores", "2", "results/runs/embedded-a/train/final", check=False)
    console = proc.stdout + proc.stderr
    assert proc.returncode != 0
    message = "embedded_train_000001.bin: 951024 bytes but the header says 500000 uint16 tokens"
    assert console.count(message) == 1, console[-3000:]
    block = console[console.index("lmpipe: train (run=embedded-a) failed") :].splitlines()[:3]
    assert "ShardError" in block[1] and message in block[1], block
    assert block[2].strip() == "log: results/logs/train/embedded-a.log", block
    log = (workdir / "results/logs/train/embedded-a.log").read_text()
    assert log.count(message) == 2  # rank 0's and rank 1's, not repeated by torchrun's summary
    assert shard.exists()  # the bad input is named, not removed


def test_a_dataset_tokenized_in_parts_is_up_to_date_once_its_parts_are_removed(tmp_path):
    """The parts' token streams are Snakemake's temp() files, removed once the shards are cut:
    gone on purpose, so lmpipe.stale does not take them for missing (a 1-minute partition limit
    makes the embedded sample two parts)."""
    workdir = make_workdir(tmp_path / "wf")
    (workdir / "parts.yaml").write_text("cluster:\n  max_runtime: 1\n")
    manifest = "results/data/embedded/tokens/manifest.json"
    built = snakemake(workdir, "--cores", "2", manifest, "--configfile", "parts.yaml")
    assert "rule tokenize_part:" in built.stdout + built.stderr
    assert not (workdir / "results/data/embedded/token_parts").exists()
    dry = snakemake(workdir, "-n", manifest, "--configfile", "parts.yaml")
    assert "Nothing to be done" in dry.stdout and "lmpipe:" not in dry.stdout + dry.stderr


def test_downloads_run_where_snakemake_runs_when_the_config_says_local(tmp_path, monkeypatch):
    """`cluster.downloads: local` (no compute node reaches the internet): under the slurm
    profile the download is a local rule, so it runs here, on a machine with no SLURM at all;
    by default it is a job of its own, sent to LMPIPE_DOWNLOAD_PARTITION where that is set."""
    for name in ("SBATCH_PARTITION", "LMPIPE_DOWNLOAD_PARTITION", "SBATCH_ACCOUNT"):
        monkeypatch.delenv(name, raising=False)
    workdir = make_workdir(tmp_path / "wf")
    (workdir / "local.yaml").write_text("cluster:\n  downloads: local\n")
    raw = "results/data/embedded/raw/manifest.json"
    here = snakemake(workdir, "--profile", "slurm", raw, "--configfile", "local.yaml")
    assert json.loads((workdir / raw).read_text())["rows"] == 1000, here.stdout[-2000:]
    assert not (workdir / "results/logs/slurm").exists()  # nothing submitted
    plan = snakemake(workdir, "--profile", "slurm", "-n", "-F", raw)
    assert "slurm_partition" not in plan.stdout  # neither variable set: the default partition
    monkeypatch.setenv("LMPIPE_DOWNLOAD_PARTITION", "transfer")
    plan = snakemake(workdir, "--profile", "slurm", "-n", "-F", raw)
    assert "slurm_partition=transfer" in plan.stdout and "runtime=30" in plan.stdout


def test_a_train_job_stopped_on_a_signal_is_said_in_one_line(tmp_path):
    """lmpipe.failures.report after a Ctrl-C: a train job stopped on the signal (its log's stop
    line) is one line naming the run, the signal and the step its checkpoint holds; a job that
    failed otherwise is described as before. (The logs are copied from a real run's.)"""
    import io

    from lmpipe.failures import report

    stopped, failed = tmp_path / "sig.log", tmp_path / "evaluate.log"
    stopped.write_text(
        "+ python -m lmpipe.train.agent --nproc-per-node=2 ...\n"
        "lmpipe.train: got SIGINT\n"
        "step     5/60 | loss 10.811523 | lr 3.00e-03 | norm 1.2318 | 71.1 ms | 0.0% MFU\n"
        "2026-12-07 01:46:27,931 [rank 0] INFO saved checkpoint results/runs/sig/train/"
        "checkpoints/step_000005\n"
        "2026-12-07 01:46:27,931 [rank 0] WARNING stopping at step 5 on SIGINT; a restart"
        " resumes from there\n"
    )
    failed.write_text("Traceback (most recent call last):\nValueError: no such thing\n")
    blocks = []
    for jobid, (rule, wildcards, log) in enumerate(
        [("train", "run=sig", stopped), ("evaluate", "run=a, eval=val_loss", failed)]
    ):
        blocks.append(
            f"[Mon Dec  7 01:49:37 2026]\nlocalrule {rule}:\n    output: results/{rule}\n"
            f"    log: {log}\n    jobid: {jobid}\n    wildcards: {wildcards}\n    threads: 2\n"
        )
    blocks.append("Terminating processes on user request, this might take some time.\n")
    for jobid, (rule, log) in enumerate([("train", stopped), ("evaluate", failed)]):
        blocks.append(
            f"[Mon Dec  7 01:49:37 2026]\nError in rule {rule}:\n    message: None\n"
            f"    jobid: {jobid}\n    output: results/{rule}\n"
            f"    log: {log} (check log file(s) for error details)\n"
        )
    (tmp_path / "snakemake.log").write_text("".join(blocks))
    out = io.StringIO()
    report(str(tmp_path / "snakemake.log"), out=out)
    assert out.getvalue().splitlines() == [
        "lmpipe: train (run=sig) stopped on SIGINT with its checkpoint at step 5; the same"
        " command again resumes from it",
        "lmpipe: evaluate (run=a, eval=val_loss) failed",
        "  ValueError: no such thing",
        f"  log: {failed}",
    ]


def test_the_workflow_profile_is_read_beside_the_slurm_profile(workdir):
    """profiles/default (rerun-incomplete: tests/test_interrupt.py) is read on every run, and a
    --profile's settings stay in force beside it: the slurm profile's default resources (8 GB)
    and printed shell commands in a dry run."""
    target = "results/data/embedded/tokens/manifest.json"
    plain = snakemake(workdir, "-n", target)
    assert "Using workflow specific profile profiles/default" in plain.stdout + plain.stderr
    slurm = snakemake(workdir, "--profile", "slurm", "-n", "-F", target)  # built or not
    console = slurm.stdout + slurm.stderr
    assert "Using profiles slurm and workflow specific profile profiles/default" in console
    assert "mem_mb=8000" in console and "Shell command: python -m lmpipe.data" in console
