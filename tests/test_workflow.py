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
        "download_hellaswag": 1,
        "evaluate": 4,  # val_loss, hellaswag, hellaswag_lm_eval, samples
    }  # fmt: skip
    for rule, count in planned.items():
        assert re.search(rf"^{rule}\s+{count}$", out, re.M), (
            f"{rule} not planned ({env_hint}):\n{out}"
        )


def test_invalid_config_stops_before_any_job(workdir, tmp_path):
    bad = tmp_path / "bad.yaml"
    text = (workdir / "config" / "config.yaml").read_text()
    bad.write_text(text.replace("max_steps: 19073", "max_step: 19073"))
    proc = snakemake(workdir, "--cores", "1", "--configfile", str(bad), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # one line naming the path, the key and the nearest one; not the schema
    line = "runs.124m.train: unknown key 'max_step' (did you mean 'max_steps'?)"
    assert line in out, out
    assert "ConfigError" in out and "additionalProperties" not in out and len(out) < 1500, out
    assert not (workdir / "results").exists()  # no job ran


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
