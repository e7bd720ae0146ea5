"""Weights & Biases logging (a run's logging.wandb), always in W&B's offline mode: off by default
and then never imported; on, the records of metrics.jsonl with the step as the x axis, one W&B run
continued across a resume without a step logged twice, its files in the run's folder, no secret
anywhere; switching it on or off retrains nothing (tests/test_sweep_caching.py, a real run)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import CONFIG_FILE as CONFIG
from conftest import wandb_history as history
from lmpipe import config as lmconfig
from lmpipe import schema
from lmpipe.config import WandbConfig
from lmpipe.train.metrics import Metrics, WandbRun
from lmpipe.train.wandb_log import DIR_VARIABLES, WANDB_DIR, run_id

# (a real training with W&B offline: tests/test_train.py)

SECRET = "wandb-secret-3f9c1e7a-never-written"
OFFLINE = WandbConfig(project="lmpipe-test", group="g", mode="offline")


# ---- the config ----------------------------------------------------------------------------------


def test_wandb_is_off_by_default_and_never_in_the_train_params():
    """Snakemake reruns a job whose params change: the train params are the same either way."""
    config = schema.load_config(CONFIG)
    run = config["reports"]["embedded"]["runs"][0]
    assert lmconfig.run_config(config, run).logging.wandb is None
    assert lmconfig.wandb_settings(config, run) is None
    off = lmconfig.train_params(config, run)
    config["runs"][run]["logging"] = {"wandb": {"project": "p", "mode": "offline"}}
    assert lmconfig.train_params(config, run) == off
    on = json.loads(lmconfig.wandb_settings(config, run))
    assert on == {"project": "p", "group": None, "mode": "offline"}


def test_a_sweeps_points_are_a_wandb_group(tmp_path):
    import yaml

    raw = yaml.safe_load(CONFIG.read_text())
    raw["runs"]["embedded-sweep"]["logging"] = {"wandb": {"project": "p"}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = schema.load_config(path)
    points = config["reports"]["sweep-embedded"]["runs"]
    groups = {json.loads(lmconfig.wandb_settings(config, p))["group"] for p in points}
    assert groups == {"embedded"}
    assert lmconfig.wandb_settings(config, "embedded-a") is None  # other runs: still off


def test_the_run_id_is_stable_and_in_wandbs_characters():
    a = run_id("lr-124m/lr=6e-4_model=d12", "0123456789abcdef")
    assert a == run_id("lr-124m/lr=6e-4_model=d12", "0123456789abcdef")
    assert set(a) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
    assert len(a) <= 64 and a != run_id("lr-124m/lr=6e-4_model=d12", "fedcba9876543210")
    assert a != run_id("lr-124m/lr=6e-4_model+d12", "0123456789abcdef")  # alike once cleaned


# ---- logging off: wandb never loads --------------------------------------------------------------


def test_logging_off_never_imports_wandb(tmp_path):
    """The trainer's modules and a run's metrics without logging.wandb, and a rank other than 0
    with it: no wandb in the process, no wandb folder (a train env without the extra works)."""
    code = (
        "import sys; from pathlib import Path\n"
        "import lmpipe.train.launch, lmpipe.train.pretrain\n"
        "from lmpipe.config import WandbConfig\n"
        "from lmpipe.train.metrics import Metrics, WandbRun\n"
        f"out = Path({str(tmp_path)!r})\n"
        "w = WandbRun(WandbConfig('p'), 'r', 'h', {})\n"
        "for m in Metrics(out, 0, True), Metrics(out, 0, False, w):  # off; on, not rank 0\n"
        "    m.write({'step': 1, 'tokens': 8, 'loss': 1.0}); m.close()\n"
        "assert 'wandb' not in sys.modules, 'wandb was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / WANDB_DIR).exists()


# ---- logging on ----------------------------------------------------------------------------------


@pytest.fixture
def wandb_env(monkeypatch, tmp_path):
    """W&B's variables restored after the test (the writer sets its dirs in the process), a
    home of its own, and a secret in the environment that must never be written."""
    for variable in (*DIR_VARIABLES, "WANDB_MODE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for variable in DIR_VARIABLES:
        monkeypatch.setenv(variable, "unset")  # monkeypatch restores what the writer overwrites


def record(step: int) -> dict:
    return {"step": step, "tokens": 8 * step, "loss": 10.0 / (step + 1), "lr": 1e-3}


def test_a_resume_continues_the_wandb_run_without_a_step_twice(tmp_path, wandb_env):
    """An attempt logs steps 0..6 and dies after its checkpoint of step 3; the next resumes at 3
    and redoes 4..6 (bit for bit) before 7..9: W&B gets each step once, in order."""
    out = tmp_path / "train"
    out.mkdir()
    w = WandbRun(OFFLINE, "sweep/lr=1e-3", "0123456789abcdef", {"train": {"lr": 1e-3}})
    first = Metrics(out, 0, True, w)
    for step in range(7):
        first.write(record(step))
    first.close()
    resumed = Metrics(out, 3, True, w)
    for step in range(4, 10):
        resumed.write(record(step))
    resumed.close()
    rows = history(out)
    assert [r["step"] for r in rows] == list(range(10))
    assert [r["train/loss"] for r in rows] == [record(s)["loss"] for s in range(10)]
    runs = sorted((out / WANDB_DIR / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(p.name.endswith(run_id(w.run, w.digest)) for p in runs)


def test_the_launcher_passes_wandb_on_and_stops_early_without_it(monkeypatch):
    """`--wandb` reaches the workers; with wandb not installed the launcher stops before
    torchrun, naming the extra."""
    from lmpipe.train import launch

    job = {"run": "r", "dataset": "d", "model": {"n_layer": 1, "n_head": 1, "n_embd": 8}}
    job |= {"launch": {"device": "cpu", "nodes": 1, "procs_per_node": 1, "peak_flops": None}}
    job["train"] = {"seq_len": 8, "micro_batch": 1, "batch_tokens": 8, "max_steps": 1}
    job["train"]["optimizer"] = {"name": "adamw", "lr": 1e-3}
    settings = lmconfig.canonical_json({"project": "p", "group": None, "mode": "offline"})
    argv = ["--config-json", json.dumps(job), "--data", "m.json", "--out", "o", "--wandb", settings]
    started = []
    monkeypatch.setattr(launch, "run_forwarding", lambda cmd, env, to_workers: started.append(cmd))
    launch.main(argv)
    (cmd,) = started
    assert cmd[cmd.index("--wandb") + 1] == settings
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match=r"runs\.r\.logging\.wandb .*lmpipe\[wandb\]"):
        launch.main(argv)
    assert len(started) == 1
