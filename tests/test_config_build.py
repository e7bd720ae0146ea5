"""lmpipe.config's building blocks against their docstrings: canonical JSON and the settings hash,
build() and its conversions, the typed sections' derived values, and which dataset a run reads."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from conftest import CONFIG_FILE
from lmpipe import config as lc
from lmpipe import schema
from lmpipe.paths import Layout
from lmpipe.registry import OPTIMIZERS


@pytest.fixture(scope="module")
def shipped() -> dict:
    return schema.load_config(CONFIG_FILE)


@pytest.fixture
def cfg(shipped) -> dict:
    return copy.deepcopy(shipped)


def test_canonical_json_sorts_keys_without_spaces_and_the_hash_is_its_sha256():
    """Equal settings in any key order give one string; the hash is its sha256, 16 hex digits."""
    a = lc.canonical_json({"b": 1, "a": {"y": [1, 2], "x": None}})
    assert a == '{"a":{"x":null,"y":[1,2]},"b":1}'
    assert (
        lc.settings_hash({"a": {"x": None, "y": [1, 2]}, "b": 1})
        == (hashlib.sha256(a.encode()).hexdigest()[:16])
    )
    assert lc.settings_hash({"b": 2}) != lc.settings_hash({"b": 1})


def test_did_you_mean_suggests_the_nearest_valid_key_or_nothing():
    """A near miss gets a suggestion; an unrelated key none."""
    assert lc.did_you_mean("batch_token", ["batch_tokens", "seq_len"]) == (
        " (did you mean 'batch_tokens'?)"
    )
    assert lc.did_you_mean("zzz", ["batch_tokens", "seq_len"]) == ""


def test_build_converts_nested_sections_tuples_and_optional_fields():
    """A nested dataclass from its dict, a list into a tuple field, None kept for `X | None`."""
    job = lc.build(
        lc.RunConfig,
        {
            "name": "r",
            "dataset": "d",
            "model_name": "tiny",
            "model": {"n_layer": 1, "n_head": 1, "n_embd": 8},
            "train": {"seq_len": 4, "micro_batch": 1, "batch_tokens": 4, "optimizer": {}},
            "launch": {"device": "cpu"},
            "base": {"run": "a"},
            "sft": None,
        },
        "runs.r",
        train=lambda d, w: lc.train_config(
            d | {"optimizer": {"name": "adamw", "lr": 0.1, "betas": [0.8, 0.9]}}, w
        ),
    )
    assert job.model == lc.ModelConfig(n_layer=1, n_head=1, n_embd=8)
    assert job.train.optimizer.betas == (0.8, 0.9)
    assert job.train.schedule == lc.ScheduleConfig()
    assert job.base == lc.BaseConfig(run="a") and job.sft is None and not job.fine_tuning


def test_build_names_the_place_of_a_non_mapping():
    """A section that is not a mapping is an error naming its path."""
    with pytest.raises(lc.ConfigError, match=r"^runs\.r\.launch: expected a mapping, got 3$"):
        lc.build(lc.LaunchConfig, 3, "runs.r.launch")


def test_accumulation_steps_divide_the_batch_or_say_why_not():
    """batch_tokens / (seq_len * micro_batch * world_size), or an error with the numbers."""
    t = lc.train_config(
        {
            "seq_len": 8,
            "micro_batch": 2,
            "batch_tokens": 64,
            "optimizer": {"name": "adamw", "lr": 1},
        },
        "train",
    )
    steps = [t.grad_accum_steps(w) for w in (1, 2, 4)]
    assert steps == [4, 2, 1] and all(type(n) is int for n in steps)
    with pytest.raises(lc.ConfigError, match=r"64 is not divisible by .* = 8 \* 2 \* 3 = 48"):
        t.grad_accum_steps(3)


def test_world_size_is_nodes_times_processes():
    """Launch and placement: nodes x procs_per_node ranks."""
    assert lc.LaunchConfig(device="cuda", nodes=3, procs_per_node=4).world_size == 12
    assert lc.Placement("cuda", nodes=2, procs_per_node=8, peak_flops=None).world_size == 16


def test_an_unknown_optimizer_or_evaluation_is_named_with_the_known_ones():
    """optimizer.name and an eval job's evaluation must be registered ones."""
    with pytest.raises(
        lc.ConfigError, match=r"^runs\.r\.train\.optimizer\.name: unknown optimizer 'adamx'"
    ):
        lc.optimizer_settings({"name": "adamx"}, "runs.r.train.optimizer")
    known = ", ".join(OPTIMIZERS)
    with pytest.raises(lc.ConfigError, match=f"did you mean 'adamw'.*known: {known}"):
        lc.optimizer_settings({"name": "adamx"}, "o")
    assert lc.optimizer_settings({"name": "adamw"}, "o") is OPTIMIZERS["adamw"].settings
    job = json.dumps({"run": "r", "evaluation": "helaswag", "settings": {}})
    with pytest.raises(
        lc.ConfigError, match="unknown evaluation 'helaswag' .did you mean 'hellaswag'"
    ):
        lc.EvalJob.from_json(job)


def test_named_models_are_the_config_files_sizes():
    """d12 is GPT-2 124M's shape (12 layers, 12 heads, 768 wide), d24 350M's."""
    models = lc.named_models(CONFIG_FILE)
    assert (models["d12"].n_layer, models["d12"].n_head, models["d12"].n_embd) == (12, 12, 768)
    assert (models["d24"].n_layer, models["d24"].n_head, models["d24"].n_embd) == (24, 16, 1024)
    assert models["d12"].vocab_size == 50257 and models["d12"].block_size == 1024


def test_layout_follows_the_paths_section(cfg):
    """paths.results and paths.data place every stage's files."""
    cfg["paths"] = {"results": "out", "data": "/scratch/d"}
    assert lc.layout(cfg) == Layout(results="out", data="/scratch/d")


def test_which_datasets_a_run_reads(cfg):
    """Text dataset: own, base run's or HF base's; chat: own, first fine-tuning's, or None."""
    assert lc.is_conversations(cfg, "vicuna-dummy") and not lc.is_conversations(cfg, "embedded")
    assert lc.is_fine_tuning(cfg, "embedded-a-chat") and not lc.is_fine_tuning(cfg, "embedded-a")
    assert lc.text_dataset(cfg, "embedded-a") == "embedded"
    assert lc.text_dataset(cfg, "embedded-a-chat") == "embedded"
    cfg["runs"]["embedded-a-chat"]["base"] = {"hf": "gpt2", "dataset": "fineweb10B"}
    assert lc.text_dataset(cfg, "embedded-a-chat") == "fineweb10B"
    cfg["runs"]["embedded-a-chat"]["base"] = {"run": "embedded-a"}
    assert lc.chat_dataset(cfg, "embedded-a-chat") == "vicuna-dummy"
    assert lc.chat_dataset(cfg, "embedded-b") is None
    second = copy.deepcopy(cfg["runs"]["embedded-a-chat"]) | {"dataset": "a-chats"}
    cfg["runs"]["z-chat"] = second
    cfg["datasets"]["a-chats"] = cfg["datasets"]["vicuna-dummy"]
    assert lc.chat_dataset(cfg, "embedded-a") == "a-chats"


def test_data_params_hold_their_sections_fields_and_the_dataset_name(cfg):
    """download: the source fields; tokenize and conversations: their fields + the name."""
    down = json.loads(lc.download_params(cfg, "embedded"))
    assert set(down) <= {"source", "path", "repo", "name", "revision", "max_files"}
    assert down["source"] == "local"
    tok = json.loads(lc.tokenize_params(cfg, "embedded"))
    assert tok["dataset"] == "embedded" and "source" not in tok and "shard_tokens" in tok
    conv = lc.ConversationsConfig(**json.loads(lc.conversations_params(cfg, "vicuna-dummy")))
    assert conv.dataset == "vicuna-dummy" and conv.source == "local"


def test_train_params_of_a_fine_tuning_run_carry_its_base_and_epochs(cfg):
    """The base (without unset keys) and sft settings are part of a fine-tuning run's params."""
    job = json.loads(lc.train_params(cfg, "embedded-a-chat"))
    assert job["base"] == {"run": "embedded-a"} and job["sft"]["epochs"] == 10
    assert "base" not in json.loads(lc.train_params(cfg, "embedded-a"))


def test_report_params_keep_the_reports_run_order(cfg):
    """Canonical JSON sorts keys, so the report's order of runs is carried explicitly."""
    cfg["reports"]["embedded"]["runs"] = ["embedded-b", "embedded-a"]
    rep = json.loads(lc.report_params(cfg, "embedded"))
    assert rep["order"] == ["embedded-b", "embedded-a"] and rep["report"] == "embedded"
    assert rep["gpu_hour_price"] == 0.0
    a = rep["runs"]["embedded-a"]
    assert a["text_dataset"] == "embedded" and a["chat_dataset"] == "vicuna-dummy"
    assert a["evaluations"] == lc.evaluations_of(cfg, "embedded-a")
    assert a["train"] == json.loads(lc.train_params(cfg, "embedded-a"))["train"]
    assert a["eval"]["hellaswag"]["items"] == 100


def test_run_config_is_the_runs_typed_config(cfg):
    """Name, dataset and the model's name and shape of a run, as the config says."""
    rc = lc.run_config(cfg, "embedded-a-chat")
    assert (rc.name, rc.dataset, rc.model_name) == ("embedded-a-chat", "vicuna-dummy", "tiny")
    assert rc.model == lc.build(lc.ModelConfig, cfg["models"]["tiny"], "m") and rc.fine_tuning


@pytest.mark.parametrize(
    ("section", "where"),
    [
        (lambda c: c["models"]["tiny"], "models.tiny"),
        (lambda c: c["runs"]["embedded-a-chat"]["train"], "runs.embedded-a-chat.train"),
        (lambda c: c["runs"]["embedded-a-chat"]["launch"], "runs.embedded-a-chat.launch"),
        (lambda c: c["runs"]["embedded-a-chat"]["eval"]["chat"], "runs.embedded-a-chat.eval.chat"),
        (lambda c: c["runs"]["embedded-a-chat"]["base"], "runs.embedded-a-chat.base"),
        (lambda c: c["runs"]["embedded-a-chat"]["sft"], "runs.embedded-a-chat.sft"),
    ],
)
def test_run_config_names_the_yaml_path_of_a_bad_key(cfg, section, where):
    """Built without the schema's check, an unknown key still names its place in the YAML."""
    section(cfg)["zz"] = 1
    with pytest.raises(lc.ConfigError, match=f"^{where}: unknown key 'zz'$"):
        lc.run_config(cfg, "embedded-a-chat")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda j: j["model"].pop("n_head"), "train job.model: 'n_head' is required"),
        (lambda j: j["train"].update(zz=1), "train job.train: unknown key 'zz'"),
        (
            lambda j: j["train"]["optimizer"].update(name="adamx"),
            "train job.train.optimizer.name: unknown optimizer 'adamx'",
        ),
        (lambda j: j["train"]["optimizer"].update(lrr=1), "train job.train.optimizer: unknown key"),
    ],
)
def test_a_train_jobs_errors_name_the_nested_key(cfg, change, message):
    """TrainJob.from_json: an error deep in the job names its path from `train job`."""
    job = json.loads(lc.train_params(cfg, "embedded-a"))
    change(job)
    with pytest.raises(lc.ConfigError, match=f"^{message}"):
        lc.TrainJob.from_json(json.dumps(job))


def test_an_eval_job_reads_back_its_run_and_evaluation(cfg):
    """EvalJob.from_json: run, evaluation and its section's typed settings."""
    ev = lc.EvalJob.from_json(lc.eval_params(cfg, "embedded-b", "samples"))
    assert (ev.run, ev.evaluation, ev.settings.top_k) == ("embedded-b", "samples", 50)
    bad = json.dumps({"run": "r", "evaluation": "samples", "settings": {"topk": 1}})
    with pytest.raises(lc.ConfigError, match=r"^eval\.samples: unknown key 'topk'"):
        lc.EvalJob.from_json(bad)


def test_a_named_models_error_names_the_model(tmp_path):
    """named_models: an incomplete size is an error naming models.<name>."""
    (tmp_path / "c.yaml").write_text("models:\n  d1: {n_layer: 1, n_embd: 8}\n")
    with pytest.raises(lc.ConfigError, match=r"^models\.d1: 'n_head' is required"):
        lc.named_models(tmp_path / "c.yaml")
