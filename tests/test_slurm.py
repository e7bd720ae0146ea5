"""The `slurm` profile against a real SLURM: slurmctld + two slurmd on this machine (tests/slurm/).

One Snakemake run builds the embedded report with every rule as a SLURM job; while it runs, the test
sends the train job of `embedded-a` the SIGTERM that `--signal=TERM@T` sends before a time limit.
The trainer checkpoints and fails, Snakemake submits the job again, training resumes, and the final
weights equal those of `embedded-a-ref` (the same settings, never interrupted). A second run trains
on two SLURM nodes, one torchrun a node; a third shows the sbatch line of the 124M train job.

Skipped with the reason where SLURM cannot be started (not root, packages not installable).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, make_workdir

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STATE = Path(os.environ.get("LMPIPE_SLURM_STATE", "/tmp/lmpipe-slurm"))
OVERLAY = REPO / "tests" / "slurm" / "config.yaml"
OVERLAY_RUNS = yaml.safe_load(OVERLAY.read_text())["runs"]
TIMEOUT = 900  # seconds a Snakemake run may take before the test gives up on it


@pytest.fixture(scope="module")
def cluster():
    """A running local SLURM (started here and stopped after, unless it was already up)."""
    if os.geteuid() != 0:
        pytest.skip("a local SLURM needs root (slurmctld/slurmd run as root here)")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        pytest.skip("no SLURM packages and no apt-get to install them")
    proc = subprocess.run(
        ["bash", str(REPO / "tests/slurm/setup.sh"), str(STATE)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode == 2:
        pytest.skip(f"local SLURM cannot be started: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = "already running" not in proc.stdout
    yield STATE
    if started:
        subprocess.run(["bash", str(REPO / "tests/slurm/teardown.sh"), str(STATE)], timeout=120)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, cluster):
    wd = make_workdir(tmp_path_factory.mktemp("slurm"))
    shutil.copy(OVERLAY, wd / "slurm-test.yaml")
    return wd


def snakemake_cmd(*args: str) -> list[str]:
    # --profile slurm: ./slurm/config.yaml of the workdir (the repo's profile, copied)
    return [
        sys.executable, "-m", "snakemake", "--profile", "slurm",
        "--configfile", "config/config.yaml", "slurm-test.yaml",
        "--slurm-init-seconds-before-status-checks", "2",  # the profile's 20 s: too slow here
        "--set-threads", "tokenize=2",  # the rule asks 16 CPUs; the test nodes have 2
        "--verbose", *args,
    ]  # fmt: skip


def env() -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1")
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    for k in ("SBATCH_ACCOUNT", "SBATCH_PARTITION"):
        e.pop(k, None)
    return e


def jobs_of(run_uuid: str) -> list[dict[str, str]]:
    """SLURM's record of a Snakemake run's jobs (squeue keeps finished jobs for MinJobAge)."""
    out = subprocess.run(
        ["squeue", "--states=all", "-h", "--name", run_uuid, "-o", "%i|%T|%N|%k"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    keys = ("id", "state", "nodes", "comment")
    rows = [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines()]
    return sorted(rows, key=lambda r: int(r["id"]))


def run_uuid_of(log: str) -> str:
    match = re.search(r"SLURM run ID: ([\w-]+)", log)
    assert match, f"no SLURM run ID in Snakemake's output:\n{log[-3000:]}"
    return match.group(1)


def finish(proc: subprocess.Popen, log_path: Path) -> str:
    try:
        proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # Snakemake cancels its SLURM jobs on SIGINT
        proc.wait(timeout=60)
    return log_path.read_text()


# ---- 1 + 2: the embedded report, every rule a SLURM job, one train job preempted ----------------


@pytest.fixture(scope="module")
def report_run(workdir):
    """The embedded report through the profile; embedded-a's first train job gets SIGTERM."""
    log_path = workdir / "snakemake-report.log"
    targets = ["results/report_embedded.html", "results/runs/embedded-a-ref/train/final"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            snakemake_cmd("--jobs", "2", *targets),
            cwd=workdir, env=env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    ckpts = workdir / "results/runs/embedded-a/train/checkpoints"

    def steps() -> list[int]:
        # complete checkpoints only: step_NNNNNN (written as step_NNNNNN.tmp, then renamed)
        names = [p.name for p in ckpts.glob("step_*")] if ckpts.is_dir() else []
        return sorted(int(n[5:]) for n in names if re.fullmatch(r"step_\d+", n))

    signalled, at_signal, after_fail = None, None, None
    try:
        deadline = time.monotonic() + TIMEOUT
        while signalled is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            text = log_path.read_text()
            # wait for the first periodic checkpoint: the train job is running, mid-way
            if "SLURM run ID" not in text or not steps():
                continue
            train = [
                j for j in jobs_of(run_uuid_of(text))
                if j["comment"] == "rule_train_wildcards_embedded-a" and j["state"] == "RUNNING"
            ]  # fmt: skip
            if train:
                signalled, at_signal = train[0]["id"], steps()
                # what slurmctld does at --signal=TERM@T: SIGTERM to every process of the job steps
                subprocess.run(["scancel", "--signal=TERM", signalled], check=True)
        while signalled and proc.poll() is None and time.monotonic() < deadline:
            # the checkpoints the stopped job left (before its retry starts and adds more)
            state = [j["state"] for j in jobs_of(run_uuid_of(text)) if j["id"] == signalled]
            if state and state[0] not in ("RUNNING", "COMPLETING"):
                after_fail = steps()
                break
            time.sleep(0.2)
    except BaseException:  # no stray Snakemake (and SLURM jobs) when the watching fails
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        raise
    text = finish(proc, log_path)
    return {
        "rc": proc.returncode,
        "log": text,
        "signalled": signalled,
        "at_signal": at_signal,
        "after_fail": after_fail,
    }


def test_embedded_report_built_with_every_rule_a_slurm_job(workdir, report_run):
    log = report_run["log"]
    assert report_run["rc"] == 0, log[-6000:]
    assert (workdir / "results/report_embedded.html").stat().st_size > 0
    jobs = jobs_of(run_uuid_of(log))
    rules = {re.sub(r"^rule_(\w+?)_wildcards.*|^rule_(\w+)$", r"\1\2", j["comment"]) for j in jobs}
    expected = {"tokenize", "prepare_conversations", "train", "convert", "evaluate", "report"}
    assert expected <= rules, jobs
    assert "download" not in rules  # a local rule: it runs where the internet is
    assert all(j["state"] in ("COMPLETED", "FAILED") for j in jobs), jobs
    # the job completion record of slurmctld lists them too
    record = (STATE / "jobcomp.txt").read_text()
    for j in jobs:
        assert f"JobId={j['id']} " in record


def test_preempted_train_job_resumes_to_the_same_weights(workdir, report_run):
    assert report_run["signalled"], "the train job of embedded-a was never seen running"
    jobs = [
        j for j in jobs_of(run_uuid_of(report_run["log"]))
        if j["comment"] == "rule_train_wildcards_embedded-a"
    ]  # fmt: skip
    # the signalled job failed; Snakemake's retry ran as a new SLURM job and completed
    assert [j["state"] for j in jobs] == ["FAILED", "COMPLETED"], jobs
    assert jobs[0]["id"] == report_run["signalled"]
    # the stopped job saved a checkpoint of its own, between two periodic ones, and the retry
    # resumed from it
    every = OVERLAY_RUNS["embedded-a"]["train"]["checkpoint_every"]
    before, after = report_run["at_signal"], report_run["after_fail"]
    assert after and after[-1] > before[-1] and after[-1] % every, (before, after)
    train_log = (workdir / "results/logs/train/embedded-a.log").read_text()
    resumed = re.search(r"resumed from \S+step_(\d+)", train_log)
    assert resumed and int(resumed.group(1)) == after[-1], train_log[-3000:]
    final = json.loads((workdir / "results/runs/embedded-a/train/final/meta.json").read_text())
    assert final["step"] == OVERLAY_RUNS["embedded-a"]["train"]["max_steps"]

    import torch
    import torch.distributed.checkpoint as dcp

    from lmpipe.models.gpt2.model import GPT, GPTConfig

    def final_weights(run: str) -> dict[str, torch.Tensor]:
        meta = json.loads((workdir / f"results/runs/{run}/train/final/meta.json").read_text())
        sd = GPT(GPTConfig(**meta["model"])).state_dict()
        dcp.load({"model": sd}, checkpoint_id=str(workdir / f"results/runs/{run}/train/final"))
        return sd

    resumed_sd, reference = final_weights("embedded-a"), final_weights("embedded-a-ref")
    assert resumed_sd.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(resumed_sd[name], tensor), f"{name} differs after the resume"


# ---- 3: two nodes -----------------------------------------------------------------------------


def test_train_on_two_slurm_nodes_one_torchrun_each(workdir):
    log_path = workdir / "snakemake-two-nodes.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            # fake GPUs (2 a node, GRES): the allocation carries them, the ranks run on gloo
            snakemake_cmd("results/runs/two-nodes/train/final",
                          "--set-resources", "train:gres='gpu:2'"),
            cwd=workdir, env=env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    text = finish(proc, log_path)
    assert proc.returncode == 0, text[-6000:]
    call = re.search(r"sbatch call: (sbatch [^\n]*rule_train_wildcards_two-nodes.*?) --wrap=", text)
    assert call, text[-4000:]
    assert {"--gres=gpu:2", "--nodes=2", "--ntasks=2"} <= set(call.group(1).split())
    (job,) = [j for j in jobs_of(run_uuid_of(text)) if j["comment"].startswith("rule_train")]
    assert job["state"] == "COMPLETED" and job["nodes"] == "n[1-2]", job
    prov = json.loads((workdir / "results/runs/two-nodes/train/provenance.json").read_text())
    assert prov["world_size"] == 4 and len(prov["hosts"]) == 4
    assert sorted(prov["slurm_nodes"]) == ["n1", "n1", "n2", "n2"], prov["slurm_nodes"]
    train_log = (workdir / "results/logs/train/two-nodes.log").read_text()
    agents = re.findall(r"node agent on (n\d) \(node (\d), (\d+) GPUs\)", train_log)
    assert sorted(agents) == [("n1", "0", "2"), ("n2", "1", "2")], train_log[-3000:]
    meta = json.loads((workdir / "results/runs/two-nodes/train/final/meta.json").read_text())
    assert meta["world_size"] == 4
    assert meta["step"] == OVERLAY_RUNS["two-nodes"]["train"]["max_steps"]


# ---- 4: the sbatch line of the 124M train job ----------------------------------------------------


def test_sbatch_line_of_the_124m_train_job_follows_the_config(workdir, cluster):
    """Submitted for real, then cancelled: the test nodes lack 8 GPUs, it would pend forever."""
    for f in ("raw", "tokens"):  # pretend the data stages ran: only train is submitted
        p = workdir / f"results/data/fineweb10B/{f}/manifest.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
        time.sleep(0.01)
    # and the HellaSwag file its in-training evaluation reads (train.eval_every), never fetched
    hellaswag = workdir / "results/data/hellaswag/hellaswag_val.jsonl"
    hellaswag.parent.mkdir(parents=True, exist_ok=True)
    hellaswag.write_text((REPO / "resources/hellaswag_val_sample.jsonl").read_text())
    e = env() | {"SBATCH_PARTITION": "debug"}
    log_path = workdir / "snakemake-124m.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            snakemake_cmd("--retries", "0", "results/runs/124m/train/final"),
            cwd=workdir, env=e, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline, job_id = time.monotonic() + 300, None
    while job_id is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        match = re.search(r"submitted with SLURM jobid (\d+)", log_path.read_text())
        job_id = match and match.group(1)
    if job_id:
        subprocess.run(["scancel", job_id], check=True)
    out = finish(proc, log_path)
    assert job_id, out[-4000:]
    calls = re.findall(r"sbatch call: (sbatch [^\n]*?) --wrap=", out)
    assert calls, out[-4000:]
    call = calls[0].split()
    launch = {"gpus": 8, "nodes": 1, "cpus": 64, "mem": 480000, "minutes": 240, "signal": 300}
    assert f"--gres=gpu:{launch['gpus']}" in call
    assert f"--nodes={launch['nodes']}" in call
    assert f"--cpus-per-task={launch['cpus']}" in call
    assert call[call.index("--mem") + 1] == str(launch["mem"])
    assert call[call.index("-t") + 1] == str(launch["minutes"])
    assert f"--signal=TERM@{launch['signal']}" in call
    assert call[call.index("-p") + 1] == "debug"  # from SBATCH_PARTITION
    assert not any(a.startswith(("--ntasks", "--gpus")) for a in call)  # one task, GRES a node
    # slurmctld took the same request
    job = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True
    ).stdout
    assert "cpu=64,mem=480000M,node=1" in job and "TimeLimit=04:00:00" in job, job
    assert "TresPerNode=gres:gpu:8" in job, job

    # the account comes from SBATCH_ACCOUNT (a dry run: account checks need slurmdbd)
    dry = subprocess.run(
        snakemake_cmd("-n", "results/runs/124m/train/final"),
        cwd=workdir, env=e | {"SBATCH_ACCOUNT": "proj42"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert "slurm_account=proj42" in dry.stdout + dry.stderr, dry.stdout[-3000:]
