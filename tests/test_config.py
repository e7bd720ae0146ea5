"""The config: schema validation (Snakemake's validate, then the registry's sections), one-line
errors that name the YAML path, the cross-field checks, and what each stage's params hold."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from dataclasses import dataclass

import pytest
import yaml

from conftest import REPO
from lmpipe import config as lmconfig
from lmpipe import config_schema, schema
from lmpipe.registry import EVAL_SECTIONS, EVALUATIONS, OPTIMIZERS
from lmpipe.settings import OPTIONAL, optional, section_schema, setting
from lmpipe.train.loop import NOT_TRAJECTORY

CONFIG = REPO / "config" / "config.yaml"
SCHEMA_DRAFT = "https://json-schema.org/draft/2020-12/schema"


@pytest.fixture
def cfg() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def write(tmp_path, cfg) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def error_of(tmp_path, cfg) -> str:
    with pytest.raises(lmconfig.ConfigError) as e:
        schema.load_config(write(tmp_path, cfg))
    return str(e.value)


def test_shipped_config_is_valid_and_gets_defaults():
    cfg = schema.load_config(CONFIG)
    run = lmconfig.run_config(cfg, "124m")
    # llm.c's GPT-2 124M recipe
    opt, schedule = run.train.optimizer, run.train.schedule
    assert run.train.batch_tokens == 524288 and run.train.seq_len == 1024
    assert opt.name == "adamw" and opt.lr == 6e-4 and opt.fused
    assert schedule.warmup_steps == 700 and schedule.lr_floor == 0
    assert opt.weight_decay == 0.1 and run.train.grad_clip == 1.0 and opt.betas == (0.9, 0.95)
    assert run.train.max_steps * run.train.batch_tokens == pytest.approx(10e9, rel=0.001)
    assert run.train.grad_accum_steps(run.launch.world_size) == 1
    assert run.model.arch == "gpt2"
    big = lmconfig.run_config(cfg, "350m")
    assert big.train.optimizer.lr == 3e-4 and big.train.max_steps == 60000
    assert big.train.max_steps * big.train.batch_tokens == pytest.approx(31.5e9, rel=0.01)
    assert cfg["datasets"]["fineweb10B"]["name"] == "sample-10BT"
    assert cfg["datasets"]["fineweb100B"]["name"] == "sample-100BT"
    # defaults the schema and the registry's sections fill in
    assert cfg["runs"]["embedded-a"]["train"]["seed"] == 1337
    assert cfg["runs"]["embedded-a"]["train"]["optimizer"]["weight_decay"] == 0.1
    assert cfg["runs"]["embedded-a"]["eval"]["samples"] == {"tokens": 48, "top_k": 50, "seed": 42}


# ---- one line, naming the path, the key and the nearest valid key -------------------------------


def test_unknown_key_names_path_key_and_nearest(tmp_path, cfg):
    cfg["runs"]["124m"]["train"]["max_step"] = cfg["runs"]["124m"]["train"].pop("max_steps")
    message = error_of(tmp_path, cfg)
    assert message.startswith(
        "runs.124m.train: unknown key 'max_step' (did you mean 'max_steps'?)"
    ), message
    assert "\n" not in message and len(message) < 200, message  # one line, not the schema


def test_unknown_top_level_key_is_named(tmp_path, cfg):
    cfg["dataset"] = {}
    message = error_of(tmp_path, cfg)
    assert message.startswith("config: unknown key 'dataset' (did you mean 'datasets'?)"), message


def test_wrong_type_is_named(tmp_path, cfg):
    cfg["runs"]["124m"]["train"]["max_steps"] = "many"
    assert error_of(tmp_path, cfg).startswith(
        "runs.124m.train.max_steps: 'many' is not of type 'integer'"
    )


def test_an_exponent_without_a_point_gets_the_yaml_hint(tmp_path):
    text = CONFIG.read_text().replace("lr: 3.0e-3 }", "lr: 3e-3 }", 1)
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(lmconfig.ConfigError) as e:
        schema.load_config(tmp_path / "c.yaml")
    # (embedded-a, or its copy embedded-a-tok4k, which a YAML merge key gives the same train)
    assert re.match(
        r"runs\.embedded-a(-tok4k)?\.train\.optimizer\.lr: '3e-3' is a string to YAML", str(e.value)
    )
    assert "write 3.0e-3" in str(e.value)


@pytest.mark.parametrize(
    "edit, message",
    [
        # the sections lmpipe.registry defines: optimizer settings, evaluation sections
        (
            lambda c: c["runs"]["124m"]["train"]["optimizer"].update(name="adam"),
            "runs.124m.train.optimizer.name: unknown optimizer 'adam' (did you mean 'adamw'?)",
        ),
        (
            lambda c: c["runs"]["124m"]["train"]["optimizer"].update(beta=0.9),
            "runs.124m.train.optimizer: unknown key 'beta' (did you mean 'betas'?)",
        ),
        (
            lambda c: c["runs"]["124m"]["eval"].update(hellaswag={"itmes": 10}),
            "runs.124m.eval.hellaswag: unknown key 'itmes' (did you mean 'items'?)",
        ),
        (
            lambda c: c["runs"]["124m"]["eval"].update(hellaswg={}),
            "runs.124m.eval: unknown key 'hellaswg' (did you mean 'hellaswag'?)",
        ),
        (
            lambda c: c["runs"]["124m"]["eval"]["val_loss"].update(tokens=0),
            "runs.124m.eval.val_loss.tokens: 0 is less than the minimum of 1",
        ),
        (
            lambda c: c["models"]["d12"].update(arch="gtp2"),
            "models.d12.arch: unknown architecture 'gtp2' (did you mean 'gpt2'?)",
        ),
        # cross-field checks
        (
            lambda c: c["runs"]["124m"].update(dataset="fineweb10b"),
            "runs.124m.dataset: unknown dataset 'fineweb10b' (did you mean 'fineweb10B'?)",
        ),
        (lambda c: c["runs"]["124m"].update(model="d99"), "runs.124m.model: unknown model 'd99'"),
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
        (
            lambda c: c["runs"]["embedded-a-chat"]["sft"].update(replay=1),
            "runs.embedded-a-chat.sft.replay: 1 is greater than or equal to the maximum of 1",
        ),
        (
            lambda c: c["runs"]["124m"]["eval"]["hellaswag"].update(file="ful"),
            "runs.124m.eval.hellaswag.file: unknown HellaSwag file 'ful' (did you mean 'full'?)",
        ),
    ],
)
def test_errors_name_the_yaml_path(tmp_path, cfg, edit, message):
    edit(cfg)
    assert error_of(tmp_path, cfg).startswith(message)


def test_build_refuses_unknown_and_missing_keys():
    cls = EVAL_SECTIONS["hellaswag"]
    with pytest.raises(lmconfig.ConfigError, match=r"eval\.hellaswag: unknown key 'itms'"):
        lmconfig.build(cls, {"itms": 3}, "eval.hellaswag")
    with pytest.raises(lmconfig.ConfigError, match=r"model: 'n_head' is required"):
        lmconfig.build(lmconfig.ModelConfig, {"n_layer": 2, "n_embd": 8}, "model")


# ---- the schema is generated from the settings' dataclasses -------------------------------------


def test_every_setting_has_its_schema_and_its_default_there():
    """Each section's properties are its dataclass's fields, with the dataclass's defaults (the
    generator's own reading of a field, checked on the text Snakemake reads)."""
    defs = yaml.safe_load(config_schema.render())["definitions"]
    for name, cls in {"train": lmconfig.TrainConfig, "launch": lmconfig.LaunchConfig}.items():
        props = defs[name]["properties"]
        assert list(props) == [f.name for f in dataclasses.fields(cls)]
    assert defs["train"]["properties"]["grad_clip"]["default"] == lmconfig.TrainConfig.grad_clip
    hellaswag = defs["eval"]["properties"]["hellaswag"]["properties"]
    assert hellaswag["items"]["default"] == EVAL_SECTIONS["hellaswag"].items


@dataclass(frozen=True)
class _Schedule:
    """When it runs during training."""

    every: int = setting(0, "every N steps; 0: off", minimum=0)
    tasks: list[str] = setting([], "which")


@dataclass(frozen=True)
class _Section:
    items: int = setting(5, "items", minimum=1)
    during_training: _Schedule = setting(_Schedule(), "its schedule during training")
    later: _Schedule | None = optional()  # absent: None


def test_a_nested_settings_dataclass_is_an_object_with_its_own_defaults(tmp_path):
    """A section may hold a dataclass of settings: the schema nests it (its docstring the
    description where the field has none), Snakemake's validate() fills in its defaults, and
    lmpipe.config builds it back."""
    from snakemake.utils import validate

    section = section_schema(_Section)
    nested = section["properties"]["during_training"]
    assert nested["type"] == "object" and nested["default"] == {}
    assert nested["description"] == "its schedule during training"
    assert section["properties"]["later"]["type"] == "object"
    assert section["properties"]["later"]["description"] == "When it runs during training."
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"$schema": SCHEMA_DRAFT} | section))
    data = {"during_training": {"every": 7}}
    validate(data, str(path))
    assert data == {"items": 5, "during_training": {"every": 7, "tasks": []}}
    built = lmconfig.build(_Section, data, "eval.x")
    assert built == _Section(during_training=_Schedule(every=7))
    with pytest.raises(Exception, match="-1 is less than the minimum of 0"):
        validate({"during_training": {"every": -1}}, str(path))


def test_registry_sections_get_their_dataclass_defaults(tmp_path, cfg):
    config = schema.load_config(write(tmp_path, cfg))
    for run in config["runs"].values():
        for section, cls in EVAL_SECTIONS.items():
            assert set(run["eval"][section]) == {f.name for f in dataclasses.fields(cls)}
        if run["train"] is None:
            continue  # a reference run: no training, no optimizer
        opt = run["train"]["optimizer"]
        default = OPTIMIZERS[opt["name"]].settings(name=opt["name"], lr=opt["lr"])
        # the keys the shipped runs leave out, filled in: each optimizer's own
        filled = {"adamw": ("weight_decay", "eps"), "muon": ("momentum", "ns_steps")}
        for key in filled[opt["name"]]:
            assert key in opt
        # every setting filled in, but an optional one (no schema default) only where set
        fields = dataclasses.fields(default)
        filled_in = {f.name for f in fields if not f.metadata.get(OPTIONAL)}
        assert filled_in <= set(opt) <= {f.name for f in fields}


# ---- params: each stage gets only what it depends on ---------------------------------------------


def test_params_carry_only_their_stage(tmp_path, cfg):
    base = schema.load_config(write(tmp_path, cfg))

    def params(c):
        out = {
            "download": lmconfig.download_params(c, "embedded"),
            "tokenize": lmconfig.tokenize_params(c, "embedded"),
            "train": lmconfig.train_params(c, "embedded-a"),
            "train_b": lmconfig.train_params(c, "embedded-b"),
        }
        for evaluation in lmconfig.evaluations_of(c, "embedded-a"):
            out[evaluation] = lmconfig.eval_params(c, "embedded-a", evaluation)
        return out

    before = params(base)
    changes = {
        ("tokenize",): lambda c: c["datasets"]["embedded"].update(shard_tokens=123),
        ("train",): lambda c: c["runs"]["embedded-a"]["train"]["optimizer"].update(lr=0.5),
        # one HellaSwag setting: both HellaSwag evaluations, nothing else
        ("hellaswag", "hellaswag_lm_eval"): lambda c: c["runs"]["embedded-a"]["eval"][
            "hellaswag"
        ].update(items=7),
        ("val_loss",): lambda c: c["runs"]["embedded-a"]["eval"]["val_loss"].update(tokens=8),
        ("samples",): lambda c: c["runs"]["embedded-a"]["eval"]["samples"].update(top_k=3),
        ("sft_loss", "chat_samples"): lambda c: c["runs"]["embedded-a"]["eval"]["chat"].update(
            batch=3
        ),
    }
    for stages, change in changes.items():
        c = copy.deepcopy(base)
        change(c)
        after = params(c)
        changed = {k for k in before if before[k] != after[k]}
        assert changed == set(stages), (stages, changed)
    # cluster-only resources never retrain
    c = copy.deepcopy(base)
    c["runs"]["embedded-a"]["launch"]["runtime"] = 999
    assert lmconfig.train_params(c, "embedded-a") == before["train"]
    assert json.loads(before["train"])["train"]["optimizer"]["lr"] == 3e-3


def test_evaluations_follow_the_runs_settings(tmp_path, cfg):
    config = schema.load_config(write(tmp_path, cfg))
    every = [e for e in EVALUATIONS if e != "suite_lm_eval"]  # the suite's harness is off
    # a base of a fine-tuning run gets the chat evaluations; its fine-tuning asks for no lm-eval
    assert lmconfig.evaluations_of(config, "embedded-a") == every
    assert lmconfig.evaluations_of(config, "embedded-b") == [
        e for e in every if e not in ("sft_loss", "chat_samples")
    ]
    assert "hellaswag_lm_eval" not in lmconfig.evaluations_of(config, "embedded-a-chat")
    assert "sft_loss" in lmconfig.evaluations_of(config, "embedded-a-chat")


def test_each_input_kind_has_its_one_path(tmp_path, cfg):
    """The evaluate rule's inputs come from each entry's kinds, each kind's path the one
    function of lmpipe.config.INPUT_FILES; the evaluations sharing a section share its
    dataclass."""
    config = schema.load_config(write(tmp_path, cfg))
    assert {k for e in EVALUATIONS.values() for k in e.inputs} <= set(lmconfig.INPUT_FILES)
    assert lmconfig.eval_inputs(config, "embedded-a-chat", "val_loss") == {
        "tokens": "results/data/embedded/tokens/manifest.json"  # its base's text dataset
    }
    assert lmconfig.eval_inputs(config, "embedded-a", "hellaswag") == {
        "hellaswag": config["hellaswag"]["embedded"]
    }
    assert lmconfig.eval_inputs(config, "embedded-a", "sft_loss") == {
        "conversations": "results/data/vicuna-dummy/sft/manifest.json"  # its fine-tuning's
    }
    assert lmconfig.eval_inputs(config, "embedded-a", "samples") == {}
    for e in EVALUATIONS.values():
        assert EVAL_SECTIONS[e.section] is e.settings, e.name


def test_the_trainer_and_an_evaluation_read_their_params_back(tmp_path, cfg):
    config = schema.load_config(write(tmp_path, cfg))
    job = lmconfig.TrainJob.from_json(lmconfig.train_params(config, "embedded-a-chat"))
    assert job.sft == lmconfig.SFTConfig(epochs=10, warmup_ratio=0.04, replay=0.05)
    assert job.base == lmconfig.BaseConfig(run="embedded-a")
    assert job.train.optimizer.weight_decay == 0.0 and job.launch.world_size == 1
    ev = lmconfig.EvalJob.from_json(lmconfig.eval_params(config, "embedded-a", "hellaswag"))
    assert ev.settings == EVAL_SECTIONS["hellaswag"](file="embedded", items=100)


def test_the_cli_checks_a_file_in_one_line(tmp_path, cfg, capsys):
    assert schema.main([str(CONFIG)]) == 0
    cfg["runs"]["124m"]["launch"]["gpu"] = 8
    assert schema.main([write(tmp_path, cfg)]) == 1
    err = capsys.readouterr().err
    assert "runs.124m.launch: unknown key 'gpu'" in err and len(err.splitlines()) == 1
    assert schema.main(["--print"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert set(printed["definitions"]["eval"]["properties"]) == set(EVAL_SECTIONS)


def test_checkpoint_async_is_in_the_train_params_only_when_on():
    """Adding the key must not rerun finished runs: Snakemake reruns a job whose params change,
    so `false` (the old behaviour) leaves the params as they were before the key existed."""
    config = schema.load_config(CONFIG)
    run = config["reports"]["embedded"]["runs"][0]
    off = json.loads(lmconfig.train_params(config, run))["train"]
    assert "checkpoint_async" not in off and "keep_checkpoints" in off
    config["runs"][run].setdefault("train", {})["checkpoint_async"] = True
    on = json.loads(lmconfig.train_params(config, run))["train"]
    assert on["checkpoint_async"] is True
    assert {k: v for k, v in on.items() if k != "checkpoint_async"} == off
    assert "checkpoint_async" in NOT_TRAJECTORY  # a resumed run may switch it


def test_the_compile_scope_and_mode_are_in_a_runs_params_and_hash_only_when_set():
    """At their defaults (regions, default) a compiled run's params and its trajectory's hash
    are what they were before the keys existed: it neither reruns nor restarts."""
    from lmpipe.config import TrainJob
    from lmpipe.data.loader import ValSet
    from lmpipe.train.loop import Task, trajectory_hash

    config = schema.load_config(CONFIG)
    off = json.loads(lmconfig.train_params(config, "124m"))
    assert off["train"]["compile"] is True
    assert not {"compile_scope", "compile_mode"} & off["train"].keys()
    changed = {"compile_scope": "model", "compile_mode": "reduce-overhead"}
    config["runs"]["124m"]["train"] |= changed
    on = json.loads(lmconfig.train_params(config, "124m"))
    assert {k: on["train"][k] for k in changed} == changed

    def digest(params: dict) -> str:
        job = TrainJob.from_json(json.dumps(params))
        return trajectory_hash(job, Task(job.train, None, ValSet([], [], 0), "data"), 8)

    before = copy.deepcopy(off)
    before["train"] |= {"compile_scope": "regions", "compile_mode": "default"}  # as filled in
    assert digest(before) == digest(off) != digest(on)


def test_sft_replay_is_in_a_fine_tuning_runs_params_only_when_on(tmp_path, cfg):
    """Fine-tuning runs trained before sft.replay existed: at 0 (the default) their params hold
    no such key, so Snakemake reruns none of them; on, the key and its share are there."""
    cfg["runs"]["embedded-a-chat"]["sft"].pop("replay", None)  # as a config before the key
    config = schema.load_config(write(tmp_path, cfg))
    off = json.loads(lmconfig.train_params(config, "embedded-a-chat"))
    assert off["sft"] == {"epochs": 10, "warmup_ratio": 0.04}  # the keys before replay
    assert config["runs"]["embedded-a-chat"]["sft"]["replay"] == 0  # the schema's default
    config["runs"]["embedded-a-chat"]["sft"]["replay"] = 0.25
    on = json.loads(lmconfig.train_params(config, "embedded-a-chat"))
    assert on["sft"] == off["sft"] | {"replay": 0.25}
    assert {k: v for k, v in on.items() if k != "sft"} == {
        k: v for k, v in off.items() if k != "sft"
    }


@pytest.mark.parametrize(
    "replay, steps",
    [(0.0, 1100), (0.1, 1230), (0.25, 1470), (0.5, 2210)],  # by hand: 10 * (443 // (4 (1 - r)))
)
def test_a_fine_tuning_runs_steps_keep_its_epochs_of_conversations(replay, steps):
    """443 training conversations (the demo's), 4 rows a step, 10 epochs: 110 steps an epoch
    without replay, and 443 // (4 * (1 - replay)) with it, its conversation rows being the rest
    of each step."""
    assert lmconfig.SFTConfig(epochs=10, replay=replay).steps(443, 4) == steps
    assert lmconfig.SFTConfig(epochs=1, replay=replay).steps(1, 4) == 0  # under one step


def test_one_gres_builder_for_the_train_rule_and_the_derived_resources():
    gpu = lmconfig.LaunchConfig(device="cuda", procs_per_node=8, gpu_model="a100")
    assert gpu.gres(gpu.procs_per_node) == "gpu:a100:8" and gpu.gres(1) == "gpu:a100:1"
    assert lmconfig.LaunchConfig(device="cuda").gres(2) == "gpu:2"
    assert lmconfig.LaunchConfig(device="cpu", procs_per_node=2).gres(2) is None


def test_muons_momentum_warmup_is_in_a_runs_params_and_hash_only_when_on():
    """embedded-modern (Muon) trained before the warmup (and scalar_lr) existed: at their defaults
    its params and its trajectory's hash are what they were, so it neither reruns nor restarts."""
    from lmpipe.config import TrainJob
    from lmpipe.data.loader import ValSet
    from lmpipe.train.loop import Task, trajectory_hash

    config = schema.load_config(CONFIG)
    off = json.loads(lmconfig.train_params(config, "embedded-modern"))
    assert off["train"]["optimizer"]["name"] == "muon"
    added = {"momentum_warmup_steps", "momentum_start", "scalar_lr"}
    assert not added & off["train"]["optimizer"].keys()
    config["runs"]["embedded-modern"]["train"]["optimizer"]["momentum_warmup_steps"] = 300
    on = json.loads(lmconfig.train_params(config, "embedded-modern"))
    assert on["train"]["optimizer"]["momentum_warmup_steps"] == 300

    def digest(params: dict) -> str:
        job = TrainJob.from_json(json.dumps(params))
        return trajectory_hash(job, Task(job.train, None, ValSet([], [], 0), "data"), 2)

    before = copy.deepcopy(off)
    for key in added:  # as the schema fills them in
        before["train"]["optimizer"][key] = lmconfig.ADDED_OPTIMIZER_KEYS[key]
    assert digest(before) == digest(off) != digest(on)


def test_one_reduction_a_step_leaves_a_runs_params_and_hash_as_they_were():
    """fsdp.reduce_each_micro_step at its default (false: once a step) is left out of a run's
    params and trajectory hash, so a run trained before the key existed neither reruns nor
    restarts; true (each micro-step) is in both."""
    from lmpipe.config import TrainJob
    from lmpipe.data.loader import ValSet
    from lmpipe.train.loop import Task, trajectory_hash

    config = schema.load_config(CONFIG)
    off = json.loads(lmconfig.train_params(config, "embedded-a"))
    assert "reduce_each_micro_step" not in off["train"]["fsdp"]
    config["runs"]["embedded-a"]["train"].setdefault("fsdp", {})["reduce_each_micro_step"] = True
    on = json.loads(lmconfig.train_params(config, "embedded-a"))
    assert on["train"]["fsdp"]["reduce_each_micro_step"] is True

    def digest(params: dict) -> str:
        job = TrainJob.from_json(json.dumps(params))
        return trajectory_hash(job, Task(job.train, None, ValSet([], [], 0), "data"), 2)

    before = copy.deepcopy(off)
    before["train"]["fsdp"]["reduce_each_micro_step"] = False  # as the schema fills it in
    assert digest(before) == digest(off) != digest(on)


def test_the_speedrun_presets_optimizer_is_its_records():
    """modded-nanogpt's record of 2025-01-04 (records/010425_SoftCap/*.txt, its train_gpt.py):
    `Muon(hidden_matrix_params, lr=0.05, momentum=0.95)` with Nesterov, its momentum
    `(1 - frac) * 0.85 + frac * 0.95` for `frac = min(step / 300, 1)`; `torch.optim.Adam(...,
    betas=(0.8, 0.95))` without weight decay, the head at lr 0.008; 1390 steps of 8 x 64 x 1024
    tokens, the last 40% a linear cooldown, no clipping."""
    rc = lmconfig.run_config(schema.load_config(CONFIG), "speedrun-124m")
    o, t = rc.train.optimizer, rc.train
    assert (o.name, o.lr, o.momentum, o.nesterov) == ("muon", 0.05, 0.95, True)
    assert (o.momentum_warmup_steps, o.momentum_start) == (300, 0.85)
    assert (tuple(o.adam_betas), o.adam_weight_decay, o.adam_lr) == ((0.8, 0.95), 0.0, 0.008)
    assert o.embed_lr == 0.6 and rc.model.embed_init_std == 1.0  # its embedding: lr, N(0, 1)
    assert (t.max_steps, t.batch_tokens, t.grad_clip) == (1390, 8 * 64 * 1024, 0.0)
    assert t.schedule.cooldown_steps == round(0.4 * 1390) and t.schedule.warmup_steps == 0
    # its GPT(num_layers=12, num_heads=6, model_dim=768): half-truncated rotary, no attention
    # in blocks.7, and its CausalSelfAttention's c_q, c_k, c_v apart
    m = rc.model
    assert (m.n_layer, m.n_head, m.n_embd) == (12, 6, 768)
    assert (m.rope_frequencies, tuple(m.no_attention)) == ("half_truncated", (7,))
    assert (m.qkv, m.unet_skips, o.scalar_lr) == ("separate", True, 0.04)  # its skip_weights
    assert (m.value_embeddings, m.embedding_mix) == (3, True)  # ValueEmbedding, Block.lambdas
    # its CastedLinear (nn.Linear's init) and its loss over the whole 50,304-column head
    assert (m.linear_init, m.loss_over_padding, m.padded_vocab_size) == ("uniform", True, 50304)


def test_the_speedrun_presets_rows_and_attention_are_its_records(tmp_path):
    """The record's train_gpt.py: `max_device_batch_size = 64*1024` tokens a GPU as one row
    (`inputs.ndim == 1`), rank r's the r-th of the step's 8 slices of the shard
    (`DistributedDataLoader.next_batch`); attention within documents (`document_causal`) over
    128-token blocks growing 128 -> 1,792 (`get_sliding_window_blocks`). The loader gives those
    rows; the model takes one (a forward and loss on the meta device: shapes, no memory)."""
    import numpy as np
    import torch

    from lmpipe.data.loader import DataShare, ShardLoader
    from lmpipe.data.shards import write_shard
    from lmpipe.models import architecture

    rc = lmconfig.run_config(schema.load_config(CONFIG), "speedrun-124m")
    t, m = rc.train, rc.model
    assert (t.seq_len, t.micro_batch, rc.launch.procs_per_node) == (65536, 1, 8)
    assert t.batch_tokens == 8 * 65536 and m.block_size >= 65536
    assert (m.document_mask, m.attention_window, m.attention_window_final) == (True, 128, 1792)
    assert rc.eval["val_loss"].batch * m.block_size == 65536  # the val rows: one a forward
    tokens = np.arange(2 * t.batch_tokens + 1) % 50257
    write_shard(tmp_path / "train.bin", tokens.astype(np.uint16))
    for rank in (0, 5):
        loader = ShardLoader([tmp_path / "train.bin"], 1, 65536, t.batch_tokens, DataShare(rank, 8))
        for step in range(2):
            x, y = loader.next_batch()
            start = step * t.batch_tokens + rank * 65536
            assert (
                x.shape == (1, 65536)
                and x[0, 0] == tokens[start]
                and y[0, -1] == tokens[start + 65536]
            )
    with torch.device("meta"):
        model = architecture(m.arch).Model(m)
        idx = torch.zeros(1, 65536, dtype=torch.long)
        assert model(idx, idx)[1].shape == ()


def test_embedded_speedrun_is_speedrun_124m_scaled_down():
    """The recipes benchmark's record recipe is speedrun-124m's: the same optimizer and model
    settings, but for the ones scaled to its steps (momentum warmup, cooldown: the same fractions)
    and depth (value-embedding tables, the block without attention); and its GPT-2 baseline sees
    the same data, tokens a step and steps, at the same size."""
    config = schema.load_config(CONFIG)
    small = json.loads(lmconfig.train_params(config, "embedded-speedrun"))
    large = json.loads(lmconfig.train_params(config, "speedrun-124m"))
    base = json.loads(lmconfig.train_params(config, "embedded-a4"))
    s, big = small["train"], large["train"]
    scaled = {"momentum_warmup_steps"}
    assert {k: v for k, v in s["optimizer"].items() if k not in scaled} == {
        k: v for k, v in big["optimizer"].items() if k not in scaled
    }
    steps = s["max_steps"] / big["max_steps"]
    warmup = big["optimizer"]["momentum_warmup_steps"]
    assert s["optimizer"]["momentum_warmup_steps"] == round(warmup * steps)
    assert s["schedule"]["cooldown_steps"] == round(big["schedule"]["cooldown_steps"] * steps)
    assert s["schedule"]["warmup_steps"] == big["schedule"]["warmup_steps"]
    assert s["grad_clip"] == big["grad_clip"]
    shape = {"n_layer", "n_head", "n_embd", "block_size", "no_attention", "value_embeddings"}
    # the record's 65,536-token rows' attention: its window (128 and up) covers a whole 128-token
    # row, and the small recipe trains causal rows (the benchmark was measured so)
    shape |= {"document_mask", "attention_window", "attention_window_final"}
    # the benchmark's figures were measured with llm.c's init and the loss over the real vocabulary
    shape |= {"linear_init", "loss_over_padding"}
    m, bigm = small["model"], large["model"]
    assert {k: v for k, v in m.items() if k not in shape} == {
        k: v for k, v in bigm.items() if k not in shape
    }
    depth = m["n_layer"] / bigm["n_layer"]
    assert m["value_embeddings"] == round(bigm["value_embeddings"] * depth)
    assert m["no_attention"] == [round(i * depth) for i in bigm["no_attention"]]
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        assert base["model"][key] == m[key]
    for key in ("seq_len", "micro_batch", "batch_tokens", "max_steps", "val_tokens"):
        assert base["train"][key] == s[key]
    assert base["dataset"] == small["dataset"] and base["launch"] == small["launch"]


def test_a_result_format_raised_reruns_that_evaluation_only(cfg):
    """val_loss's results hold each document's losses (result_format 2): its params say so, so
    results scored before it are scored again; every other evaluation's params are unchanged."""
    schema.validate(cfg)
    val = json.loads(lmconfig.eval_params(cfg, "embedded-a", "val_loss"))
    assert val["result_format"] == 2
    for name in ("hellaswag", "suite", "samples"):
        assert "result_format" not in json.loads(lmconfig.eval_params(cfg, "embedded-a", name))
    job = lmconfig.EvalJob.from_json(lmconfig.eval_params(cfg, "embedded-a", "val_loss"))
    assert job.settings.tokens == 32768
