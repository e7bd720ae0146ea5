"""A mixture's stages are cached as a dataset's: a real run of the mixture report (a 2-step
training on the embedded sample and Shakespeare, its evaluations, the report), then Snakemake's
own plan (dry runs, default rerun triggers) for each change of the mixture.

- A weight changes: the mixture's manifest, the training on it, its evaluations and the report;
  no source is downloaded or tokenized again.
- A source is added: that source alone is downloaded and tokenized.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from conftest import make_workdir, planned, snakemake

pytestmark = pytest.mark.slow

TARGET = "results/report_mixture.html"
MIX = "embedded-mix"


def mixture_config(workdir: Path) -> dict:
    """The copy's config: the mixture report of the mixture run alone, made tiny."""
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    run = config["runs"][MIX]
    run["train"].update(max_steps=2, val_every=0, val_tokens=1024, checkpoint_every=0)
    run["train"]["schedule"] = {"warmup_steps": 0}
    run["eval"] = {
        "val_loss": {"tokens": 2048},
        "hellaswag": {"file": "embedded", "items": 8, "lm_eval": False},
        "samples": {"tokens": 4},
        "suite": {"tasks": []},
    }
    config["reports"]["mixture"]["runs"] = [MIX]
    return config


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A copy of the workflow after a real run of the mixture's report."""
    workdir = make_workdir(tmp_path_factory.mktemp("mixture"))
    config = mixture_config(workdir)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    snakemake(workdir, "--cores", "2", TARGET)
    assert (workdir / TARGET).exists()
    return workdir, config


def test_nothing_changed_nothing_to_do(built):
    workdir, config = built
    assert planned(workdir, config, [TARGET]) == set()


def test_a_weight_change_reruns_the_training_and_what_follows_never_tokenizing(built):
    workdir, config = built
    changed = copy.deepcopy(config)
    changed["datasets"][MIX]["mixture"] = {"embedded": 0.5, "shakespeare": 0.5}
    jobs = planned(workdir, changed, [TARGET])
    assert {rule for rule, _ in jobs} == {
        "mixture", "train", "convert", "export_llmc", "evaluate", "report",
    }  # fmt: skip
    assert ("mixture", f"dataset={MIX}") in jobs and ("train", f"run={MIX}") in jobs


def test_a_new_source_is_the_only_data_prepared(built):
    workdir, config = built
    changed = copy.deepcopy(config)
    changed["datasets"]["shakespeare-2"] = dict(config["datasets"]["shakespeare"], val_tokens=3000)
    changed["datasets"][MIX]["mixture"]["shakespeare-2"] = 0.1
    jobs = planned(workdir, changed, [TARGET])
    data = {(rule, wc) for rule, wc in jobs if rule in ("download", "tokenize", "tokenize_part")}
    assert data == {("download", "dataset=shakespeare-2"), ("tokenize", "dataset=shakespeare-2")}
    assert ("mixture", f"dataset={MIX}") in jobs and ("train", f"run={MIX}") in jobs


def test_the_mixture_report_shows_each_source(built):
    workdir, _ = built
    html = (workdir / TARGET).read_text()
    assert 'id="sources-table"' in html
    for source in ("embedded", "shakespeare", "the mixture (weighted mean)"):
        assert f"<td>{source}</td>" in html
