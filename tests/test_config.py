"""The config: schema validation (Snakemake's validate) and the cross-field checks."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from conftest import REPO
from lmpipe import config as lmconfig

CONFIG = REPO / "config" / "config.yaml"


@pytest.fixture
def cfg() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def write(tmp_path, cfg) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_shipped_config_is_valid_and_gets_defaults():
    cfg = lmconfig.load_config(CONFIG)
    run = lmconfig.run_config(cfg, "124m")
    # llm.c's GPT-2 124M recipe
    assert run.train.batch_tokens == 524288 and run.train.seq_len == 1024
    assert run.train.lr == 6e-4 and run.train.warmup_steps == 700 and run.train.lr_floor == 0
    assert run.train.weight_decay == 0.1 and run.train.grad_clip == 1.0
    assert run.train.betas == (0.9, 0.95)
    assert run.train.max_steps * run.train.batch_tokens == pytest.approx(10e9, rel=0.001)
    assert run.train.grad_accum_steps(run.launch.world_size) == 1
    big = lmconfig.run_config(cfg, "350m")
    assert big.train.lr == 3e-4 and big.train.max_steps == 60000
    assert big.train.max_steps * big.train.batch_tokens == pytest.approx(31.5e9, rel=0.01)
    assert cfg["datasets"]["fineweb10B"]["name"] == "sample-10BT"
    assert cfg["datasets"]["fineweb100B"]["name"] == "sample-100BT"
    # a default the schema fills in
    assert cfg["runs"]["embedded-a"]["train"]["seed"] == 1337


def test_unknown_key_is_named(tmp_path, cfg):
    cfg["runs"]["124m"]["train"]["learning_rate"] = 1e-3
    with pytest.raises(Exception, match="learning_rate"):
        lmconfig.load_config(write(tmp_path, cfg))


def test_unknown_top_level_key_is_named(tmp_path, cfg):
    cfg["dataset"] = {}
    with pytest.raises(Exception, match="'dataset' was unexpected"):
        lmconfig.load_config(write(tmp_path, cfg))


def test_wrong_type_is_named(tmp_path, cfg):
    cfg["runs"]["124m"]["train"]["max_steps"] = "many"
    with pytest.raises(Exception, match=r"'many' is not of type 'integer'[\s\S]*max_steps"):
        lmconfig.load_config(write(tmp_path, cfg))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["runs"]["124m"].update(dataset="nope"), "runs.124m.dataset: unknown dataset"),
        (lambda c: c["runs"]["124m"].update(model="d99"), "runs.124m.model: unknown model"),
        (lambda c: c["reports"]["124m"]["runs"].append("x"), "reports.124m.runs: unknown run 'x'"),
        (
            lambda c: c["runs"]["124m"]["train"].update(batch_tokens=500000),
            "runs.124m: train.batch_tokens 500000 is not divisible",
        ),
        (
            lambda c: c["runs"]["124m"]["train"].update(seq_len=2048),
            "runs.124m.train.seq_len 2048 exceeds",
        ),
        (lambda c: c["models"]["d12"].update(n_head=7), "models.d12: n_embd 768 is not divisible"),
        (lambda c: c["datasets"]["embedded"].pop("path"), "datasets.embedded: source 'local'"),
    ],
)
def test_cross_field_errors_name_the_yaml_path(tmp_path, cfg, edit, message):
    edit(cfg)
    with pytest.raises(lmconfig.ConfigError, match=message.replace(".", r"\.")):
        lmconfig.load_config(write(tmp_path, cfg))


def test_from_dict_refuses_unknown_keys():
    with pytest.raises(lmconfig.ConfigError, match="eval: unknown key.*hellaswag_itmes"):
        lmconfig.from_dict(lmconfig.EvalConfig, {"hellaswag_itmes": 3}, "eval")


def test_params_carry_only_their_stage(tmp_path, cfg):
    base = lmconfig.load_config(write(tmp_path, cfg))

    def params(c):
        return {
            "download": lmconfig.download_params(c, "embedded"),
            "tokenize": lmconfig.tokenize_params(c, "embedded"),
            "train": lmconfig.train_params(c, "embedded-a"),
            "train_b": lmconfig.train_params(c, "embedded-b"),
            "eval": lmconfig.eval_params(c, "embedded-a"),
        }

    before = params(base)
    changes = {
        "tokenize": lambda c: c["datasets"]["embedded"].update(shard_tokens=123),
        "train": lambda c: c["runs"]["embedded-a"]["train"].update(lr=0.5),
        "eval": lambda c: c["runs"]["embedded-a"]["eval"].update(hellaswag_items=7),
    }
    for stage, change in changes.items():
        c = copy.deepcopy(base)
        change(c)
        after = params(c)
        changed = {k for k in before if before[k] != after[k]}
        assert changed == {stage}, (stage, changed)
    # cluster-only resources never retrain
    c = copy.deepcopy(base)
    c["runs"]["embedded-a"]["launch"]["runtime"] = 999
    assert lmconfig.train_params(c, "embedded-a") == before["train"]
    assert json.loads(before["train"])["train"]["lr"] == 3e-3
