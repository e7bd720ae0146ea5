"""A sweep's points are cached one by one: a real run of a 2-point sweep's training, then
Snakemake's own plan (dry runs, default rerun triggers) for each change of the sweep, as
tests/test_pipeline.py does for the caching cases of ordinary runs.

The points are as small as a run can be (the embedded sweep's base, 2 steps, one rank), so the
real run costs the embedded tokenizing and two short trainings.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from conftest import make_workdir, planned, snakemake
from lmpipe.job_params import params_file

pytestmark = pytest.mark.slow

SWEEP = "c"
TINY_TRAIN = {"max_steps": 2, "val_every": 0, "val_tokens": 1024, "checkpoint_every": 0}


def sweep_config(workdir: Path) -> dict:
    """The copy's config with sweep `c`: the embedded sweep's base made tiny, two lrs."""
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    base = config["runs"]["embedded-sweep"]
    base["train"].update(TINY_TRAIN)
    base["train"]["schedule"] = {"warmup_steps": 0}
    config["sweeps"] = {
        SWEEP: {"base": "embedded-sweep", "grid": {"train.optimizer.lr": [1.0e-3, 3.0e-3]}}
    }
    return config


def finals(lrs: list[str]) -> list[str]:
    return [f"results/runs/{SWEEP}/lr={lr}/train/final" for lr in lrs]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A copy of the workflow after a real run of the sweep's two trainings."""
    workdir = make_workdir(tmp_path_factory.mktemp("sweep"))
    config = sweep_config(workdir)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    snakemake(workdir, "--cores", "2", *finals(["1e-3", "3e-3"]))
    for final in finals(["1e-3", "3e-3"]):
        assert (workdir / final / "meta.json").exists()
    return workdir, config


def test_nothing_changed_nothing_to_do(trained):
    workdir, config = trained
    assert planned(workdir, config, finals(["1e-3", "3e-3"])) == set()


def test_adding_a_value_trains_only_the_new_point(trained):
    workdir, config = trained
    config = copy.deepcopy(config)
    config["sweeps"][SWEEP]["grid"]["train.optimizer.lr"].insert(1, 2.0e-3)
    targets = finals(["1e-3", "2e-3", "3e-3"])
    assert planned(workdir, config, targets) == {("train", f"run={SWEEP}/lr=2e-3")}


def test_removing_a_value_retrains_nothing(trained):
    workdir, config = trained
    config = copy.deepcopy(config)
    config["sweeps"][SWEEP]["grid"]["train.optimizer.lr"] = [3.0e-3]
    assert planned(workdir, config, finals(["3e-3"])) == set()


def test_changing_the_base_retrains_every_point_that_inherits_it(trained):
    workdir, config = trained
    config = copy.deepcopy(config)
    config["runs"]["embedded-sweep"]["train"]["seed"] = 7
    expected = {("train", f"run={SWEEP}/lr={lr}") for lr in ("1e-3", "3e-3")}
    assert planned(workdir, config, finals(["1e-3", "3e-3"])) == expected


def test_changing_a_swept_key_of_the_base_retrains_nothing(trained):
    """The base's own lr is replaced in every point: no point inherits it."""
    workdir, config = trained
    config = copy.deepcopy(config)
    config["runs"]["embedded-sweep"]["train"]["optimizer"]["lr"] = 5.0e-3
    assert planned(workdir, config, finals(["1e-3", "3e-3"])) == set()


def test_switching_wandb_on_or_off_retrains_nothing(trained):
    """logging.wandb is not a training setting: on (the points then a W&B group, the sweep's
    name) or off, a finished point is left alone; a job that runs gets it as --wandb @FILE."""
    workdir, config = trained
    config = copy.deepcopy(config)
    config["runs"]["embedded-sweep"]["logging"] = {"wandb": {"project": "p", "mode": "offline"}}
    targets = finals(["1e-3", "3e-3"])
    assert planned(workdir, config, targets) == set()
    path = workdir / "wandb_on.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    forced = snakemake(
        workdir, targets[0], "-n", "-p", "--forcerun", targets[0], "--configfile", str(path)
    )
    # the job reads it from the file that holds that JSON (lmpipe.job_params; a dry run writes none)
    wandb = '{"group":"c","mode":"offline","project":"p"}'
    assert f"--wandb {params_file(wandb, 'results/params', write=False)} " in forced.stdout
    del config["runs"]["embedded-sweep"]["logging"]
    assert planned(workdir, config, targets) == set()
