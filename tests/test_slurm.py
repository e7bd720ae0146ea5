"""The `slurm` profile against a real SLURM: slurmctld + two slurmd on this machine (tests/slurm/).

One Snakemake run builds the embedded report with every rule as a SLURM job; while it runs, the test
sends the train job of `embedded-a` the SIGTERM that `--signal=TERM@T` sends before a time limit.
The trainer checkpoints and fails, Snakemake submits the job again, training resumes, and the final
weights equal those of `embedded-a-ref` (the same settings, never interrupted). A second run trains
on two SLURM nodes, one torchrun a node; a third shows the sbatch line of the 124M train job.

The fault matrix (docs/faults.md): a two-node job preempted, a two-node job one of whose nodes
dies (SIGKILL to all its processes there), and a run longer than its time limit, stopped by
SLURM's own timer; each resumes in a new job, and the first two end with the uninterrupted
`two-nodes` run's weights.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, default_stop_signals, make_workdir

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


def popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
    """A Snakemake started as a terminal starts it: its stop signals at their defaults, so
    that the Ctrl-C a test sends reaches it whatever this pytest worker ran before."""
    return subprocess.Popen(*args, preexec_fn=default_stop_signals, **kwargs)


def finish(proc: subprocess.Popen, log_path: Path, timeout: float = TIMEOUT) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # Snakemake cancels its SLURM jobs on SIGINT
        proc.wait(timeout=60)
    return log_path.read_text()


def checkpoint_steps(workdir: Path, run: str) -> list[int]:
    """The steps of a run's complete checkpoints (step_NNNNNN: written as .tmp, then renamed)."""
    ckpts = workdir / f"results/runs/{run}/train/checkpoints"
    names = [p.name for p in ckpts.glob("step_*")] if ckpts.is_dir() else []
    return sorted(int(n[5:]) for n in names if re.fullmatch(r"step_\d+", n))


def newest_checkpoint(workdir: Path, run: str) -> dict[str, Any] | None:
    """The newest complete checkpoint of a run: its step, what is broken in it (None: nothing)
    and its train_state.json."""
    from lmpipe.train.checkpoint import damage

    steps = checkpoint_steps(workdir, run)
    if not steps:
        return None
    path = workdir / f"results/runs/{run}/train/checkpoints/step_{steps[-1]:06d}"
    state = json.loads((path / "train_state.json").read_text())
    return {"step": steps[-1], "damage": damage(path), "state": state}


def strike_mid_run(
    workdir: Path, name: str, args: list[str], run: str, strike: Callable[[str], Any]
) -> dict[str, Any]:
    """Snakemake on `args`; once `run`'s train job is RUNNING and has written its first periodic
    checkpoint, `strike(job_id)` (a signal, a kill). Returns Snakemake's exit code and log, the
    struck job, what strike returned, the checkpoints at the strike and once the job had ended
    (and what was wrong with the newest then, before a retry prunes it), and the seconds from
    the strike to the job's end."""
    log_path = workdir / f"snakemake-{name}.log"
    with open(log_path, "w") as log:
        proc = popen(
            snakemake_cmd(*args), cwd=workdir, env=env(), stdout=log, stderr=subprocess.STDOUT
        )
    struck, struck_at, at_strike, after_end, strike_result, ended_s = None, 0.0, [], [], None, None
    newest = None
    try:
        deadline = time.monotonic() + TIMEOUT
        while struck is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            text = log_path.read_text()
            # wait for the first periodic checkpoint: the train job is running, mid-way
            if "SLURM run ID" not in text or not checkpoint_steps(workdir, run):
                continue
            running = [j for j in train_jobs(text, run) if j["state"] == "RUNNING"]
            if running:
                struck, struck_at = running[0]["id"], time.monotonic()
                at_strike = checkpoint_steps(workdir, run)
                strike_result = strike(struck)
        while struck and proc.poll() is None and time.monotonic() < deadline:
            # the checkpoints the struck job left (before its retry starts and adds more)
            state = [j["state"] for j in jobs_of(run_uuid_of(text)) if j["id"] == struck]
            if state and state[0] not in ("RUNNING", "COMPLETING"):
                ended_s = time.monotonic() - struck_at
                after_end = checkpoint_steps(workdir, run)
                newest = newest_checkpoint(workdir, run)
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
        "struck": struck,
        "strike_result": strike_result,
        "at_strike": at_strike,
        "after_end": after_end,
        "newest_at_end": newest,
        "ended_s": ended_s,
    }


def preempt(job_id: str) -> None:
    """What slurmctld does at --signal=TERM@T, and on preemption: SIGTERM to every process of
    the job's steps (not the batch shell)."""
    subprocess.run(["scancel", "--signal=TERM", job_id], check=True)


def train_jobs(log: str, run: str) -> list[dict[str, str]]:
    """The train jobs of `run` (the plugin's job comment writes a `/` of a name as `_`)."""
    comment = f"rule_train_wildcards_{run.replace('/', '_')}"
    return [j for j in jobs_of(run_uuid_of(log)) if j["comment"] == comment]


def final_weights(workdir: Path, run: str) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from lmpipe.models.gpt2.model import GPT, GPTConfig

    meta = json.loads((workdir / f"results/runs/{run}/train/final/meta.json").read_text())
    sd = GPT(GPTConfig(**meta["model"])).state_dict()
    dcp.load({"model": sd}, checkpoint_id=str(workdir / f"results/runs/{run}/train/final"))
    return sd


def assert_same_weights(workdir: Path, run: str, reference: str) -> None:
    import torch

    got, want = final_weights(workdir, run), final_weights(workdir, reference)
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), f"{name} of {run} differs from {reference}'s"


def restarts_of(workdir: Path, run: str) -> Any:
    """What the trainer recorded of a run's attempts (train/attempts.jsonl), summarised."""
    from lmpipe.report.restarts import read_attempts, summarise

    return summarise(read_attempts(workdir / f"results/runs/{run}/train/attempts.jsonl"))


def resumed_step(workdir: Path, run: str) -> int | None:
    """The step the last attempt of `run` resumed from, as its train log says."""
    train_log = (workdir / f"results/logs/train/{run}.log").read_text()
    resumed = re.findall(r"resumed from \S+step_(\d+)", train_log)
    return int(resumed[-1]) if resumed else None


# ---- 1 + 2: the embedded report, every rule a SLURM job, one train job preempted ----------------


@pytest.fixture(scope="module")
def report_run(workdir):
    """The embedded report through the profile; embedded-a's first train job gets SIGTERM."""
    targets = ["results/report_embedded.html", "results/runs/embedded-a-ref/train/final"]
    return strike_mid_run(workdir, "report", ["--jobs", "2", *targets], "embedded-a", preempt)


def test_embedded_report_built_with_every_rule_a_slurm_job(workdir, report_run):
    log = report_run["log"]
    assert report_run["rc"] == 0, log[-6000:]
    assert (workdir / "results/report_embedded.html").stat().st_size > 0
    jobs = jobs_of(run_uuid_of(log))
    rules = {re.sub(r"^rule_(\w+?)_wildcards.*|^rule_(\w+)$", r"\1\2", j["comment"]) for j in jobs}
    expected = {"tokenize", "prepare_conversations", "train", "convert", "evaluate", "report"}
    # the downloads too, by default (cluster.downloads: job; LMPIPE_DOWNLOAD_PARTITION unset)
    expected |= {"download", "download_suite"}
    assert expected <= rules, jobs
    assert all(j["state"] in ("COMPLETED", "FAILED") for j in jobs), jobs
    # the job completion record of slurmctld lists them too
    record = (STATE / "jobcomp.txt").read_text()
    for j in jobs:
        assert f"JobId={j['id']} " in record


def test_preempted_train_job_resumes_to_the_same_weights(workdir, report_run):
    assert report_run["struck"], "the train job of embedded-a was never seen running"
    jobs = train_jobs(report_run["log"], "embedded-a")
    # the signalled job failed; Snakemake's retry ran as a new SLURM job and completed
    assert [j["state"] for j in jobs] == ["FAILED", "COMPLETED"], jobs
    assert jobs[0]["id"] == report_run["struck"]
    # the stopped job saved a checkpoint of its own, between two periodic ones, and the retry
    # resumed from it
    every = OVERLAY_RUNS["embedded-a"]["train"]["checkpoint_every"]
    before, after = report_run["at_strike"], report_run["after_end"]
    assert after and after[-1] > before[-1] and after[-1] % every, (before, after)
    assert resumed_step(workdir, "embedded-a") == after[-1]
    final = json.loads((workdir / "results/runs/embedded-a/train/final/meta.json").read_text())
    assert final["step"] == OVERLAY_RUNS["embedded-a"]["train"]["max_steps"]
    assert_same_weights(workdir, "embedded-a", "embedded-a-ref")


# ---- 3: two nodes -----------------------------------------------------------------------------


def test_train_on_two_slurm_nodes_one_torchrun_each(workdir):
    log_path = workdir / "snakemake-two-nodes.log"
    with open(log_path, "w") as log:
        proc = popen(
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


# ---- faults of a two-node job: preemption, a node dying (two-nodes above is the reference) ----


def job_processes(job_id: str, node: str | None = None) -> list[Any]:
    """This machine's processes of a SLURM job's steps (by the SLURM_JOB_ID they carry), those
    on one node (their SLURMD_NODENAME) or on every node."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            environ = proc.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if environ.get("SLURM_JOB_ID") == job_id and node in (None, environ.get("SLURMD_NODENAME")):
            found.append(proc)
    return found


def kill_node(job_id: str, node: str = "n2") -> list[str]:
    """What a node's death does to the job's processes there: SIGKILL to all of them at once (the
    node agent, its torchrun and the workers). n2: not the node the batch script runs on."""
    procs = job_processes(job_id, node)
    names = [" ".join(p.cmdline()[:4]) for p in procs]
    for proc in procs:
        proc.kill()
    return names


def test_a_preempted_two_node_job_saves_on_every_rank_and_resumes(workdir):
    run, every = "two-nodes-preempted", OVERLAY_RUNS["two-nodes"]["train"]["checkpoint_every"]
    got = strike_mid_run(workdir, "preempt-two-nodes", [f"results/runs/{run}/train/final"], run,
                         preempt)  # fmt: skip
    assert got["rc"] == 0, got["log"][-6000:]
    assert [j["state"] for j in train_jobs(got["log"], run)] == ["FAILED", "COMPLETED"]
    # one checkpoint on the signal, complete: all four ranks' shards and RNG files
    before, after, saved = got["at_strike"], got["after_end"], got["newest_at_end"]
    assert after and after[-1] > before[-1] and after[-1] % every, (before, after)
    assert saved["damage"] is None and saved["state"]["world_size"] == 4, saved
    assert resumed_step(workdir, run) == after[-1]
    assert_same_weights(workdir, run, "two-nodes")
    # the trainer's record: a restart on the signal (SLURM's SIGTERM, or the node agent's
    # SIGUSR1 that forwards it, whichever reached rank 0 last), no step redone, the two job ids
    (restart,) = restarts_of(workdir, run).restarts
    assert restart.cause == "signal" and restart.why in ("SIGTERM", "SIGUSR1"), restart
    assert restart.steps_redone == 0 and restart.resumed_step == after[-1]
    assert restarts_of(workdir, run).job_ids == [j["id"] for j in train_jobs(got["log"], run)]


NODE_DEATH_BOUND_S = 60  # the other node's ranks end within this after the kill


def test_a_node_dying_ends_the_job_and_the_retry_resumes(workdir):
    run, every = "two-nodes-node-dies", OVERLAY_RUNS["two-nodes"]["train"]["checkpoint_every"]
    got = strike_mid_run(workdir, "node-dies", [f"results/runs/{run}/train/final"], run, kill_node)
    assert got["rc"] == 0, got["log"][-6000:]
    assert got["strike_result"], "no process of the train job found on n2"
    # n1's ranks did not hang on their dead peers: the job ended soon after, and failed
    assert got["ended_s"] is not None and got["ended_s"] < NODE_DEATH_BOUND_S, got["ended_s"]
    assert [j["state"] for j in train_jobs(got["log"], run)] == ["FAILED", "COMPLETED"]
    assert not job_processes(got["struck"]), "processes of the killed job are left"
    # nothing saved after the death: the retry resumed from the last periodic checkpoint
    last = got["after_end"][-1]
    assert last % every == 0 and resumed_step(workdir, run) == last, got["after_end"]
    assert_same_weights(workdir, run, "two-nodes")
    # rank 0 was killed with its node (no end line) or raised on its dead peers (an error)
    (restart,) = restarts_of(workdir, run).restarts
    assert restart.cause in ("killed", "error") and restart.resumed_step == last, restart


# ---- the time limit itself: SLURM's timer signals, no hand-sent signal --------------------------


def test_a_run_longer_than_its_time_limit_finishes_across_jobs(workdir):
    """SLURM's own timer stops the first job (--signal=TERM@60 in a 2-minute job: 30-60 s in,
    slurmctld checks every 30 s); it saves and fails, and the retry resumes from that checkpoint.
    Once the first job has ended, the test lifts the retry's limit (scontrol), so the run ends
    in two jobs however fast this machine trains. No signal is sent by hand."""
    run = "time-limit"
    log_path = workdir / "snakemake-time-limit.log"
    with open(log_path, "w") as log:
        proc = popen(
            snakemake_cmd(f"results/runs/{run}/train/final"),
            cwd=workdir, env=env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    lifted: set[str] = set()
    try:
        deadline = time.monotonic() + TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
            text = log_path.read_text()
            jobs = train_jobs(text, run) if "SLURM run ID" in text else []
            if jobs and jobs[0]["state"] not in ("PENDING", "RUNNING", "COMPLETING"):
                for job in jobs[1:]:
                    if job["id"] not in lifted:
                        lifted.add(job["id"])
                        subprocess.run(
                            ["scontrol", "update", f"JobId={job['id']}", "TimeLimit=30"], check=True
                        )
    except BaseException:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        raise
    text = finish(proc, log_path)
    assert proc.returncode == 0, text[-6000:]
    jobs = train_jobs(text, run)
    assert [j["state"] for j in jobs] == ["FAILED", "COMPLETED"], jobs
    # the first job ended by itself before its limit, after saving (not TIMEOUT, not killed)
    record = (STATE / "jobcomp.txt").read_text()
    first = re.search(rf"JobId={jobs[0]['id']} .*?StartTime=(\S+) EndTime=(\S+)", record)
    start, end = (time.mktime(time.strptime(t, "%Y-%m-%dT%H:%M:%S")) for t in first.groups())
    limit_s = 60 * OVERLAY_RUNS[run]["launch"]["runtime"]
    assert end - start < limit_s, (first.group(0), limit_s)
    # the retry resumed from the checkpoint saved on SLURM's SIGTERM (the run has no periodic
    # one before its last step), and finished
    steps = OVERLAY_RUNS[run]["train"]["max_steps"]
    assert OVERLAY_RUNS[run]["train"]["checkpoint_every"] > steps
    assert 0 < resumed_step(workdir, run) < steps, resumed_step(workdir, run)
    meta = json.loads((workdir / f"results/runs/{run}/train/final/meta.json").read_text())
    assert meta["step"] == steps
    # the trainer's record: the first attempt ended on the signal (SLURM's SIGTERM, or the
    # launcher's SIGUSR1 that forwards it, whichever reached rank 0 last), nothing redone
    restarts = restarts_of(workdir, run)
    (restart,) = restarts.restarts
    assert (restart.cause, restart.steps_redone) == ("signal", 0), restart
    assert restart.why in ("SIGTERM", "SIGUSR1"), restart
    assert restarts.job_ids == [j["id"] for j in jobs]


# ---- a sweep: its points side by side, one SLURM job each ---------------------------------------


def job_records(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """slurmctld's completion record of each job: its node list, start and end (epoch s)."""
    record = (STATE / "jobcomp.txt").read_text()
    out = {}
    for job_id in job_ids:
        line = re.search(rf"^JobId={job_id} .*$", record, re.M).group(0)
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        out[job_id] = {
            "nodes": fields["NodeList"],
            **{
                k: time.mktime(time.strptime(fields[f"{k.title()}Time"], "%Y-%m-%dT%H:%M:%S"))
                for k in ("start", "end")
            },
        }
    return out


def test_a_sweep_runs_its_points_as_concurrent_jobs_and_builds_its_report(workdir):
    log_path = workdir / "snakemake-sweep.log"
    with open(log_path, "w") as log:
        proc = popen(
            snakemake_cmd("--jobs", "4", "results/report_sweep-slurm.html"),
            cwd=workdir, env=env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    text = finish(proc, log_path)
    assert proc.returncode == 0, text[-6000:]
    points = [f"slurm/lr={lr}" for lr in ("1e-3", "3e-3", "1e-2")]
    trains = {p: train_jobs(text, p) for p in points}
    assert all(len(t) == 1 and t[0]["state"] == "COMPLETED" for t in trains.values()), trains
    records = job_records([t[0]["id"] for t in trains.values()])
    # side by side: some two points trained at the same time, and the points used both nodes
    spans = sorted((r["start"], r["end"]) for r in records.values())
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)), records
    assert {r["nodes"] for r in records.values()} >= {"n1", "n2"}, records
    html = (workdir / "results/report_sweep-slurm.html").read_text()
    for point in points:
        assert point in html and (workdir / f"results/runs/{point}/train/final").is_dir()


# ---- 4: the sbatch line of the 124M train job ----------------------------------------------------


def test_sbatch_line_of_the_124m_train_job_follows_the_config(workdir, cluster):
    """Submitted for real, then cancelled: the test nodes lack 8 GPUs, it would pend forever."""
    for f in ("raw", "tokens"):  # pretend the data stages ran: only train is submitted
        p = workdir / f"results/data/fineweb10B/{f}/manifest.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
        time.sleep(0.01)
    # and the HellaSwag file it scores during training (eval.hellaswag.during_training), never
    # fetched
    hellaswag = workdir / "results/data/hellaswag/hellaswag_val.jsonl"
    hellaswag.parent.mkdir(parents=True, exist_ok=True)
    hellaswag.write_text((REPO / "resources/hellaswag_val_sample.jsonl").read_text())
    # submitted although no test node holds it (8 GPUs, 64 CPUs, 480 GB): the check that
    # refuses such a job before submission is off (tests below hold it)
    e = env() | {"SBATCH_PARTITION": "debug", "LMPIPE_CLUSTER_CHECK": "0"}
    log_path = workdir / "snakemake-124m.log"
    with open(log_path, "w") as log:
        proc = popen(
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


# ---- 5: jobs sized to the cluster; a job no partition holds refused; one pending for good named --

TOKENS = "results/data/embedded/tokens/manifest.json"  # the cheapest target with tokenize
PENDING_BOUND_S = 60  # a job pending for good is named on the console within this


def slurm_node() -> dict[str, str]:
    """A test node as slurmctld has it (setup.sh: the machine's CPUs, at least 2; 16000 MB; 2
    fake GPUs): CPUTot, RealMemory, Gres, ..."""
    node = subprocess.run(
        ["scontrol", "show", "node", "n1"], capture_output=True, text=True, check=True
    ).stdout
    return dict(re.findall(r"(\w+)=(\S+)", node))


def node_cpus() -> int:
    return int(slurm_node()["CPUTot"])


@pytest.fixture
def fresh_workdir(tmp_path, cluster):
    """A workdir of its own (nothing tokenized yet), with a GPU run on the embedded data whose
    nodes have 512 CPUs: tokenize asks for a node's CPUs, more than any test node has. The
    download runs here (cluster.downloads: local), so tokenize is the one SLURM job."""
    wd = make_workdir(tmp_path / "wd")
    shutil.copy(OVERLAY, wd / "slurm-test.yaml")
    big = dict(OVERLAY_RUNS["embedded-a"])
    big["launch"] = {**big["launch"], "device": "cuda", "cpus_per_task": 512}
    overlay = {"runs": {"big-node": big}, "cluster": {"downloads": "local"}}
    (wd / "big-node.yaml").write_text(yaml.safe_dump(overlay))
    return wd


def fresh_cmd(*args: str) -> list[str]:
    cmd = snakemake_cmd(*args)
    cmd.insert(cmd.index("slurm-test.yaml") + 1, "big-node.yaml")
    return cmd


def test_tokenize_asks_for_the_cpus_a_node_has_and_runs_without_set_threads(fresh_workdir):
    """By default (no --set-threads) tokenize's threads are capped at the test nodes' CPUs: the
    job is submitted asking for them, and the job's own Snakemake on the node runs it with as
    many (it gets the figure from the main process: it reads no sinfo)."""
    log_path = fresh_workdir / "snakemake-tokenize.log"
    with open(log_path, "w") as log:
        proc = popen(fresh_cmd(TOKENS), cwd=fresh_workdir, env=env(), stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
    text = finish(proc, log_path, timeout=300)
    assert proc.returncode == 0, text[-6000:]
    call = re.search(
        r"sbatch call: (sbatch [^\n]*rule_tokenize_wildcards_embedded.*?) --wrap=", text
    )
    assert call and f"--cpus-per-task={node_cpus()}" in call.group(1).split(), text[-4000:]
    assert [j["state"] for j in jobs_of(run_uuid_of(text))] == ["COMPLETED"]
    assert json.loads((fresh_workdir / TOKENS).read_text())["tokens"]["train"] > 0


def test_a_job_no_partition_holds_is_refused_in_one_line_before_any_submission(fresh_workdir):
    cpus = node_cpus()
    log_path = fresh_workdir / "snakemake-refused.log"
    with open(log_path, "w") as log:
        proc = popen(
            fresh_cmd(TOKENS, "--set-threads", f"tokenize={8 * cpus}"),
            cwd=fresh_workdir, env=env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    text = finish(proc, log_path, timeout=120)
    assert proc.returncode == 1, text[-4000:]
    (line,) = [ln for ln in text.splitlines() if ln.startswith("lmpipe: rule ")]
    assert line.startswith(f"lmpipe: rule tokenize (dataset=embedded) asks {8 * cpus} CPUs,")
    assert f"partition debug (the default) has at most {cpus} CPUs" in line, line
    assert "too many CPUs" in line
    # nothing submitted: SLURM knows no job of the run, the plugin wrote no log, nothing ran
    assert jobs_of(run_uuid_of(text)) == []
    assert not (fresh_workdir / "results/logs/slurm").exists()
    assert "sbatch call" not in text and not (fresh_workdir / "results/data").exists()


def test_a_job_pending_for_good_is_named_on_the_console_within_a_minute(fresh_workdir):
    """Submitted past the check (LMPIPE_CLUSTER_CHECK=0), a tokenize job asking more CPUs than
    the partition has pends for PartitionConfig; the watch names it, then Snakemake, stopped,
    cancels it."""
    cpus = node_cpus()
    log_path = fresh_workdir / "snakemake-pending.log"
    with open(log_path, "w") as log:
        proc = popen(
            fresh_cmd(TOKENS, "--set-threads", f"tokenize={8 * cpus}"), cwd=fresh_workdir,
            env=env() | {"LMPIPE_CLUSTER_CHECK": "0"}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    submitted, named, job_id = None, None, None
    deadline = time.monotonic() + 240
    while named is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        text = log_path.read_text()
        if job_id is None and (match := re.search(r"submitted with SLURM jobid (\d+)", text)):
            submitted, job_id = time.monotonic(), match.group(1)
        if job_id and " pends for " in text:
            named = time.monotonic()
    proc.send_signal(signal.SIGINT)  # Snakemake cancels its SLURM jobs
    text = finish(proc, log_path, timeout=120)
    assert job_id and named, text[-4000:]
    assert named - submitted < PENDING_BOUND_S, named - submitted
    (line,) = [ln for ln in text.splitlines() if " pends for " in ln]
    assert line.startswith(
        f"lmpipe: SLURM job {job_id} of rule tokenize (dataset=embedded) pends for"
        " PartitionConfig, which never clears by itself:"
    ), line
    assert f"scancel {job_id}" in line
    assert [j["state"] for j in jobs_of(run_uuid_of(text))] == ["CANCELLED"]


def test_the_plan_checks_each_job_against_the_live_cluster(cluster):
    """The 124m preset against the test cluster: its train job fits no partition (one line at the
    end, `none` in its row), its tokenize job asks for a node's CPUs, not 64."""
    node = slurm_node()
    cpus, gb, gpus = node["CPUTot"], int(node["RealMemory"]) // 1000, node["Gres"].split(":")[-1]
    done = subprocess.run(
        [sys.executable, "-m", "lmpipe.plan", "results/report_124m.html", "--cluster"],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {ln[3:].split("  ")[0]: ln for ln in done.stdout.splitlines() if ln[3:].strip()}
    assert re.search(r"^!! train 124m .*  none  ", rows["train 124m"])
    assert re.search(rf"  {cpus} CPU, \d+ GB .*  debug  ", rows["tokenize fineweb10B"])
    (problem,) = [ln for ln in done.stdout.splitlines() if ln.startswith("!! train 124m: ")]
    assert "asks 64 CPUs, 480 GB and 8 GPUs a node" in problem
    assert f"has at most {cpus} CPUs, {gb} GB and {gpus} GPUs (untyped) a node, 2 nodes" in problem
