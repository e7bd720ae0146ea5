"""Every ConfigError raise path tests/test_config.py leaves out: a config that triggers it (the
shipped config/config.yaml, changed in memory) and the one-line message naming the YAML path,
the key or value, and the nearest valid name where the code suggests one."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from conftest import CONFIG_FILE
from lmpipe import config as lmconfig
from lmpipe import costs, schema

SHIPPED = yaml.safe_load(CONFIG_FILE.read_text())
CHAT = "embedded-a-chat"  # the shipped fine-tuning run (base: embedded-a, data: vicuna-dummy)


def chat_run(c: dict) -> dict:
    return c["runs"][CHAT]


def sweep(c: dict) -> dict:
    return c["sweeps"]["embedded"]  # the shipped sweep: base embedded-sweep, 5 points, a ladder


def second_chat_dataset(c: dict) -> None:
    """A second conversations dataset, and a second fine-tuning of embedded-a on it."""
    c["datasets"]["vicuna-2"] = copy.deepcopy(c["datasets"]["vicuna-dummy"])
    c["runs"]["chat-2"] = copy.deepcopy(chat_run(c)) | {"dataset": "vicuna-2"}


# (schema.py / config.py raise site, edit of the shipped config, start of the message)
CASES = {
    # lmpipe/schema.py, check_config: datasets and models
    "hf_conversations_need_repo": (
        lambda c: c["datasets"]["vicuna-dummy"].update(source="huggingface"),
        "datasets.vicuna-dummy: source 'huggingface' needs `repo`",
    ),
    "hf_text_needs_repo_and_name": (
        lambda c: c["datasets"]["fineweb10B"].pop("name"),
        "datasets.fineweb10B: source 'huggingface' needs `repo` and `name`",
    ),
    # lmpipe/schema.py, check_mixture: a mixture's sources and weights
    "mixture_negative_weight": (
        lambda c: c["datasets"]["embedded-mix"]["mixture"].update(shakespeare=-0.2),
        "datasets.embedded-mix.mixture.shakespeare: weight -0.2 is not positive",
    ),
    "mixture_zero_weight": (
        lambda c: c["datasets"]["embedded-mix"]["mixture"].update(shakespeare=0),
        "datasets.embedded-mix.mixture.shakespeare: weight 0 is not positive",
    ),
    "mixture_unknown_source": (
        lambda c: c["datasets"]["embedded-mix"]["mixture"].update(shakespear=0.2),
        "datasets.embedded-mix.mixture.shakespear: unknown dataset 'shakespear' (did you mean"
        " 'shakespeare'?)",
    ),
    "mixture_in_a_mixture": (
        lambda c: c["datasets"]["embedded-mix"]["mixture"].update({"embedded-mix": 0.1}),
        "datasets.embedded-mix.mixture.embedded-mix: 'embedded-mix' is a mixture itself",
    ),
    "mixture_of_conversations": (
        lambda c: c["datasets"]["embedded-mix"]["mixture"].update({"vicuna-dummy": 0.1}),
        "datasets.embedded-mix.mixture.vicuna-dummy: 'vicuna-dummy' is conversations, not text",
    ),
    "mixture_with_a_source_of_its_own": (
        lambda c: c["datasets"]["embedded-mix"].update(source="local", path="x.txt"),
        "datasets.embedded-mix: a mixture is its sources' data; path, source belong to a source",
    ),
    "mixture_weight_not_a_number": (
        lambda c: c["datasets"]["embedded-mix"]["mixture"].update(shakespeare="lots"),
        "datasets.embedded-mix.mixture.shakespeare",
    ),
    # config.model_config: a model's keys, those of its arch's settings (Architecture.settings)
    "setting_of_another_arch": (
        lambda c: c["models"]["tiny"].update(qk_norm=False),
        "models.tiny: unknown key 'qk_norm' for model.arch 'gpt2' (a setting of model.arch"
        " 'modern' only)",
    ),
    "model_key_typo": (
        lambda c: c["models"]["tiny"].update(n_layers=3),
        "models.tiny: unknown key 'n_layers' (did you mean 'n_layer'?)",
    ),
    "warmup_and_cooldown_exceed_the_steps": (
        lambda c: c["runs"]["embedded-a"]["train"]["schedule"].update(cooldown_steps=21),
        "runs.embedded-a.train.schedule: warmup_steps 4 + cooldown_steps 21 exceed max_steps 24",
    ),
    "padded_vocab_below_vocab": (
        lambda c: c["models"]["tiny"].update(padded_vocab_size=50000),
        "models.tiny: padded_vocab_size is below vocab_size",
    ),
    # check_config: runs
    "conversations_without_base_sft": (
        lambda c: c["runs"]["embedded-b"].update(dataset="vicuna-dummy"),
        "runs.embedded-b: dataset 'vicuna-dummy' is conversations: add base/sft",
    ),
    "pretraining_needs_max_steps": (
        lambda c: c["runs"]["embedded-b"]["train"].pop("max_steps"),
        "runs.embedded-b.train: 'max_steps' is required",
    ),
    # check_fine_tuning_run
    "fine_tuning_needs_base_and_sft": (
        lambda c: chat_run(c).pop("sft"),
        f"runs.{CHAT}: a fine-tuning run needs both `base:` and `sft:`",
    ),
    "fine_tuning_on_text": (
        lambda c: chat_run(c).update(dataset="embedded"),
        f"runs.{CHAT}.dataset: 'embedded' is not a `kind: conversations` one",
    ),
    "fine_tuning_with_max_steps": (
        lambda c: chat_run(c)["train"].update(max_steps=10),
        f"runs.{CHAT}.train.max_steps: set by sft.epochs for a fine-tuning run",
    ),
    "fine_tuning_seq_len_not_the_datasets": (
        lambda c: c["datasets"]["vicuna-dummy"].update(seq_len=64),
        f"runs.{CHAT}.train.seq_len 128 differs from datasets.vicuna-dummy.seq_len 64",
    ),
    "base_run_and_hf": (
        lambda c: chat_run(c)["base"].update(hf="some/folder"),
        f"runs.{CHAT}.base: give exactly one of `run` or `hf`",
    ),
    "base_neither_run_nor_hf": (
        lambda c: chat_run(c)["base"].pop("run"),
        f"runs.{CHAT}.base: give exactly one of `run` or `hf`",
    ),
    "base_run_unknown": (
        lambda c: chat_run(c)["base"].update(run="embedded-c"),
        f"runs.{CHAT}.base.run: 'embedded-c' is not a pretraining run of `runs:`",
    ),
    "base_run_is_a_fine_tuning": (
        lambda c: chat_run(c)["base"].update(run=CHAT),
        f"runs.{CHAT}.base.run: '{CHAT}' is not a pretraining run of `runs:`",
    ),
    "base_run_of_another_model": (
        lambda c: chat_run(c).update(model="d12"),
        f"runs.{CHAT}.model 'd12' differs from its base run's 'tiny'",
    ),
    "base_run_on_two_chat_datasets": (
        second_chat_dataset,
        "runs: base run 'embedded-a' is fine-tuned on several conversation datasets"
        " ['vicuna-2', 'vicuna-dummy']",
    ),
    "hf_base_without_text_dataset": (
        lambda c: chat_run(c).update(base={"hf": "some/folder"}),
        f"runs.{CHAT}.base.dataset: an `hf` base needs a text dataset (val loss)",
    ),
    "hf_base_on_conversations": (
        lambda c: chat_run(c).update(base={"hf": "some/folder", "dataset": "vicuna-dummy"}),
        f"runs.{CHAT}.base.dataset: an `hf` base needs a text dataset (val loss)",
    ),
    "hf_base_unknown_dataset": (
        lambda c: chat_run(c).update(base={"hf": "some/folder", "dataset": "embeded"}),
        f"runs.{CHAT}.base.dataset: unknown dataset 'embeded' (did you mean 'embedded'?)",
    ),
    # lmpipe/sweeps.py: a sweep is refused before any job, naming the sweep and the key
    "sweep_unknown_key": (
        lambda c: sweep(c)["points"][0].update({"train.optimizer.lrr": 1.0e-3}),
        "sweeps.embedded.points[0]: unknown key 'train.optimizer.lrr': run 'embedded-sweep' has"
        " no such setting (did you mean 'train.optimizer.lr'?)",
    ),
    "sweep_grid_unknown_key": (
        lambda c: sweep(c).pop("points") and sweep(c).update(grid={"train.max_step": [10, 20]}),
        "sweeps.embedded.grid: unknown key 'train.max_step': run 'embedded-sweep' has no such"
        " setting (did you mean 'train.max_steps'?)",
    ),
    "sweep_value_of_the_wrong_type": (
        lambda c: sweep(c)["points"][1].update({"train.optimizer.lr": "3e-3"}),
        "sweeps.embedded.points[1]: train.optimizer.lr = '3e-3' is a string, not a number like"
        " run 'embedded-sweep''s 0.003 (YAML reads 3e-3 as a string: write 3.0e-3)",
    ),
    "sweep_bool_for_a_number": (
        lambda c: sweep(c)["points"][0].update({"train.seq_len": True}),
        "sweeps.embedded.points[0]: train.seq_len = True is a boolean, not an integer",
    ),
    "sweep_unknown_model": (
        lambda c: sweep(c)["points"][3].update(model="tiny-m"),
        "sweeps.embedded.points[3]: model 'tiny-m' is not in `models:` (did you mean",
    ),
    "sweep_unknown_base": (
        lambda c: sweep(c).update(base="embedded-swep"),
        "sweeps.embedded.base: unknown run 'embedded-swep' (did you mean 'embedded-sweep'?)",
    ),
    "sweep_grid_and_points": (
        lambda c: sweep(c).update(grid={"train.seed": [1, 2]}),
        "sweeps.embedded: give exactly one of `grid` or `points`",
    ),
    "sweep_ladder_sweeps_max_steps": (
        lambda c: sweep(c)["points"][0].update({"train.max_steps": 5}),
        "sweeps.embedded: train.max_steps is set by tokens_per_param; do not sweep it",
    ),
    "sweep_ladder_of_fine_tuning": (
        lambda c: sweep(c).update(base=CHAT),
        "sweeps.embedded.tokens_per_param: a fine-tuning run's steps follow its epochs",
    ),
    "sweep_named_like_a_run": (
        lambda c: c["sweeps"].update({"embedded-a": c["sweeps"].pop("embedded")}),
        "sweeps.embedded-a: 'embedded-a' is also a run",
    ),
    "sweep_value_unsafe_in_a_name": (
        lambda c: (
            c["models"].update({"tiny s": c["models"]["tiny"]})
            or sweep(c)["points"][3].update(model="tiny s")
        ),
        "sweeps.embedded.points[3]: model = 'tiny s' cannot name a point",
    ),
    "sweep_two_points_one_name": (
        lambda c: sweep(c)["points"][1].update({"train.optimizer.lr": 1.0e-3}),
        "sweeps.embedded.points[1]: two points are both named 'embedded/lr=1e-3_model=tiny'",
    ),
    "sweep_point_invalid_as_a_run": (
        lambda c: sweep(c)["points"][0].update({"train.seq_len": 256}),
        "runs.embedded/lr=1e-3_model=tiny_seq_len=256.train.seq_len 256 exceeds the model's"
        " block_size 128",
    ),
    # lmpipe/schema.py, check_compile: train.compile_scope and compile_mode
    "compile_scope_without_compile": (
        lambda c: c["runs"]["embedded-a"]["train"].update(compile_scope="model"),
        "runs.embedded-a.train.compile_scope is 'model' but train.compile is false",
    ),
    "fused_loss_kernel_on_the_cpu": (
        lambda c: c["runs"]["embedded-a"]["train"].update(loss_kernel="liger"),
        "runs.embedded-a: train.loss_kernel 'liger' is a Triton kernel: launch.device cuda only"
        " (here cpu); pytorch runs anywhere",
    ),
    "fused_loss_kernel_and_chunks": (
        lambda c: c["runs"]["speedrun-124m"]["train"].update(
            loss_kernel="cut_cross_entropy", loss_chunk_tokens=8192
        ),
        "runs.speedrun-124m.train.loss_chunk_tokens 8192: loss_kernel 'cut_cross_entropy' never"
        " holds the logits; leave loss_chunk_tokens 0",
    ),
    # lmpipe/schema.py, check_precision: train.embedding_dtype
    "bf16_tables_with_fp32_compute": (
        lambda c: c["runs"]["embedded-a"]["train"].update(embedding_dtype="bfloat16"),
        "runs.embedded-a.train.embedding_dtype bfloat16 needs train.dtype bfloat16 (the tables'"
        " bf16 lookups would meet float32 weights)",
    ),
    "bf16_tables_in_one_whole_model_graph": (
        lambda c: c["runs"]["speedrun-124m"]["train"].update(compile_scope="model"),
        "runs.speedrun-124m.train.embedding_dtype bfloat16 shards the embedding tables as an"
        " FSDP unit of their own, whose hooks would break compile_scope 'model''s one graph",
    ),
    "cuda_graphs_on_the_cpu": (
        lambda c: c["runs"]["embedded-a"]["train"].update(
            compile=True, compile_mode="reduce-overhead"
        ),
        "runs.embedded-a: train.compile_mode 'reduce-overhead' captures CUDA graphs: launch.device"
        " cuda only (here cpu)",
    ),
    "cuda_graphs_fine_tuning": (
        lambda c: c["runs"]["vicuna-7b"]["train"].update(compile=True, compile_mode="max-autotune"),
        "runs.vicuna-7b.train.compile_mode 'max-autotune': CUDA graphs need static shapes",
    ),
    # explain()'s generic line through Snakemake's validate (an enum, a required key)
    "schema_enum": (
        lambda c: c["runs"]["124m"]["launch"].update(device="tpu"),
        "runs.124m.launch.device: 'tpu' is not one of ['cpu', 'cuda']",
    ),
    "schema_required": (
        lambda c: c["runs"]["124m"].pop("launch"),
        "runs.124m: 'launch' is a required property",
    ),
}


@pytest.fixture
def cfg() -> dict:
    return copy.deepcopy(SHIPPED)


@pytest.mark.parametrize("edit, message", CASES.values(), ids=CASES.keys())
def test_config_error_names_the_path(cfg, edit, message):
    """A broken config is refused with one line that names where and what."""
    edit(cfg)
    with pytest.raises(lmconfig.ConfigError) as e:
        schema.validate(cfg)
    text = str(e.value)
    assert text.startswith(message), text
    assert "\n" not in text, text


def test_shipped_config_passes_the_checks(cfg):
    """The starting point of the cases above is valid (each case breaks one thing)."""
    schema.validate(cfg)


# ---- lmpipe/config.py: reading a job's params back ----


def test_eval_job_of_an_unknown_evaluation_suggests_the_nearest(cfg):
    """An evaluate job's params naming no evaluation of the registry: named, nearest suggested."""
    schema.validate(cfg)
    params = json.loads(lmconfig.eval_params(cfg, "embedded-a", "hellaswag"))
    params["evaluation"] = "helaswag"
    with pytest.raises(lmconfig.ConfigError) as e:
        lmconfig.EvalJob.from_json(json.dumps(params))
    assert str(e.value) == "eval job: unknown evaluation 'helaswag' (did you mean 'hellaswag'?)"


def test_train_job_section_that_is_not_a_mapping_is_named(cfg):
    """A train job whose `model` is not a mapping: the section and the value are named."""
    schema.validate(cfg)
    params = json.loads(lmconfig.train_params(cfg, "embedded-a"))
    params["model"] = 12
    with pytest.raises(lmconfig.ConfigError) as e:
        lmconfig.TrainJob.from_json(json.dumps(params))
    assert str(e.value) == "train job.model: expected a mapping, got 12"


# ---- lmpipe/costs.py: a GPU the config names that the plan cannot price ----


def test_plan_names_an_unknown_gpu_model(cfg):
    """launch.gpu_model of no known peak: the plan names the run and the GPU (ValueError)."""
    cfg["runs"]["124m"]["launch"]["gpu_model"] = "mystery9000"
    schema.validate(cfg)
    run = lmconfig.run_config(cfg, "124m")
    where = r"^runs\.124m\.launch\.gpu_model: no known peak for GPU 'mystery9000'"
    with pytest.raises(ValueError, match=where + r".*as launch\.peak_flops"):
        costs.device_flops(run, None, "train")
    # the peak given: the plan uses it
    cfg["runs"]["124m"]["launch"]["peak_flops"] = 165e12
    flops, how = costs.device_flops(lmconfig.run_config(cfg, "124m"), None, "train")
    assert flops == pytest.approx(165e12 * costs.figure("train", "gpu_mfu"))
    assert "mystery9000" in how
