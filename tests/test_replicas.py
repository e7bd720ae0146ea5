"""Seeds as replicas (lmpipe.replicas): a run's `seeds` become runs of their own, each with its
train.seed, in every report that lists the run; bad seed lists are refused in one line."""

from __future__ import annotations

import copy

import pytest
import yaml

from conftest import CONFIG_FILE
from lmpipe import schema
from lmpipe.config import ConfigError
from lmpipe.replicas import recipe_of, seed_of


@pytest.fixture
def cfg() -> dict:
    return yaml.safe_load(CONFIG_FILE.read_text())


def test_the_shipped_seeds_report_lists_three_replicas_of_each_recipe(cfg):
    schema.validate(cfg)
    runs = cfg["reports"]["seeds"]["runs"]
    assert runs == [f"seeds-{r}/seed={s}" for r in ("adamw", "muon") for s in (1337, 1338, 1339)]
    assert [cfg["runs"][r]["train"]["seed"] for r in runs] == [1337, 1338, 1339] * 2
    assert "seeds-adamw" not in cfg["runs"] and "seeds" not in cfg["runs"][runs[0]]
    assert {recipe_of(r) for r in runs} == {"seeds-adamw", "seeds-muon"}
    assert seed_of(runs[4]) == 1338 and seed_of("embedded-a") is None
    # a replica differs from its recipe's other replicas in train.seed only
    a, b = (copy.deepcopy(cfg["runs"][r]) for r in runs[:2])
    a["train"].pop("seed"), b["train"].pop("seed")
    assert a == b


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda r: r.update(seeds=[1337, 1338, 1337]),
            "runs.embedded-b.seeds: seed 1337 is listed twice",
        ),
        (
            lambda r: r.update(seeds=[]),
            r"runs.embedded-b.seeds: a list of seeds \(integers from 0\), got \[\]",
        ),
        (lambda r: r.update(seeds=["1"]), "runs.embedded-b.seeds: a list of seeds"),
        (
            lambda r: (r.update(seeds=[1, 2]), r["train"].update(seed=5)),
            "give train.seed or seeds, not both",
        ),
    ],
)
def test_a_bad_seed_list_is_refused_naming_the_run(cfg, edit, message):
    edit(cfg["runs"]["embedded-b"])
    with pytest.raises(ConfigError, match=message):
        schema.validate(cfg)


def test_a_run_fine_tuned_from_a_replicated_run_must_name_a_replica(cfg):
    cfg["runs"]["embedded-a"]["seeds"] = [1, 2]
    with pytest.raises(
        ConfigError,
        match=r"embedded-a-chat.base.run: embedded-a has seeds; name one of its replicas"
        r" \(embedded-a/seed=1\)",
    ):
        schema.validate(cfg)


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (
            [["embedded-a", "embedded-z"]],
            r"reports.recipes.compare\[0\]: 'embedded-z' is not a run of this report",
        ),
        ([["embedded-a", "embedded-a"]], r"compare\[0\]: 'embedded-a' against itself"),
        (
            [["embedded-a", "embedded-modern"], ["embedded-a4", "embedded-modern"]],
            r"compare\[1\]: 'embedded-modern' is already compared against 'embedded-a'",
        ),
    ],
)
def test_a_comparison_the_report_cannot_make_is_refused(cfg, pairs, message):
    cfg["reports"]["recipes"]["compare"] = pairs
    with pytest.raises(ConfigError, match=message):
        schema.validate(cfg)


def test_the_recipes_report_compares_its_equal_token_pairs(cfg):
    """The shipped recipes report names its pairs (24 steps each, 96 each), and a comparison may
    name a replicated run by its recipe."""
    schema.validate(cfg)
    assert cfg["reports"]["recipes"]["compare"] == [
        ["embedded-a", "embedded-modern"],
        ["embedded-a4", "embedded-speedrun"],
    ]
    steps = {
        r: cfg["runs"][r]["train"]["max_steps"]
        for pair in cfg["reports"]["recipes"]["compare"]
        for r in pair
    }
    assert steps == {
        "embedded-a": 24,
        "embedded-modern": 24,
        "embedded-a4": 96,
        "embedded-speedrun": 96,
    }
    cfg = yaml.safe_load(CONFIG_FILE.read_text())
    cfg["reports"]["seeds"]["compare"] = [["seeds-muon", "seeds-adamw"]]
    schema.validate(cfg)
