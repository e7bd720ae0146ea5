"""Checking a config before any job starts: the schema, the registry's names, cross-field rules.

- `validate(config)` runs Snakemake's own `validate()` against the schema that
  lmpipe.config_schema generates from the settings' dataclasses (the registry's optimizer,
  architecture and evaluation settings included; written to a temporary file for Snakemake, which
  fills in the defaults), then what a schema
  cannot express: an optimizer or an architecture by name, a model's keys (allowed by its
  arch), the cross-field rules. Any error is a ConfigError of one line naming the YAML path, the
  key and, for a typo, the nearest valid key.
- `load_config(path)`: a file read and validated as the Snakefile does it.

    python -m lmpipe.schema config/config.yaml   # check a config: one line for a problem
    python -m lmpipe.schema --print               # the schema, every key

The Snakefile and the by-hand tools use this module; the stage jobs do not (their conda envs
hold neither Snakemake nor jsonschema): they get the checked slices (lmpipe.config).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from jsonschema import ValidationError

from lmpipe import bases, config_schema, replicas, sweeps
from lmpipe.config import (
    ADDED_TRAIN_KEYS,
    BYTE_ALPHABET,
    CUDA_GRAPH_MODES,
    EOT,
    SPLIT_PATTERNS,
    ConfigError,
    compile_problem,
    did_you_mean,
    is_conversations,
    is_fine_tuning,
    is_mixture,
    loss_kernel_problem,
    model_config,
    optimizer_settings,
    run_config,
)
from lmpipe.registry import ARCHITECTURES

SCHEMA_HINT = "  [python -m lmpipe.schema --print shows every key]"


def explain(error: Any, root: str = "") -> str:
    """One line for a jsonschema ValidationError: the YAML path, what is wrong, a hint."""
    path = ".".join(p for p in [root, *(str(p) for p in error.absolute_path)] if p)
    where = path or "config"
    if error.validator == "additionalProperties":
        valid = list(error.schema.get("properties", {}))
        unknown = sorted(k for k in error.instance if k not in valid)
        key = unknown[0] if unknown else "?"
        return f"{where}: unknown key {key!r}{did_you_mean(key, valid)}"
    if error.validator == "type" and isinstance(error.instance, str):
        if error.validator_value in ("number", "integer") and re.fullmatch(
            r"[-+]?\d+[eE][-+]?\d+", error.instance
        ):
            fixed = re.sub(r"^([-+]?\d+)[eE]([-+]?)(\d+)$", r"\1.0e\2\3", error.instance)
            fixed = fixed if re.search(r"e[-+]", fixed) else fixed.replace("e", "e+")
            return (
                f"{where}: {error.instance!r} is a string to YAML, not a number: write {fixed}"
                " (YAML needs a decimal point in a number with an exponent)"
            )
    if error.validator == "type":
        return f"{where}: {error.instance!r} is not of type {error.validator_value!r}"
    return f"{where}: {error.message}"


def _schema_error(exc: BaseException) -> Any | None:
    """The jsonschema ValidationError behind Snakemake's WorkflowError (raised while handling
    it, so it is the WorkflowError's context), if any."""
    while exc is not None and not isinstance(exc, ValidationError):
        exc = exc.__cause__ or exc.__context__
    return exc


def validate(config: dict[str, Any]) -> None:
    """Validate `config` in place (defaults filled in), then expand its seeds and sweeps into
    runs, add the Hugging Face bases' reference runs, and validate those as runs
    (lmpipe.replicas, lmpipe.sweeps, lmpipe.bases); a ConfigError names the first problem."""
    replicas.expand(config)  # before the defaults fill in train.seed: a seed given is a seed
    _validate(config)
    if sweeps.expand(config):
        _validate(config)  # the points are runs: every check a run gets
    if bases.expand(config):
        _validate(config)  # each Hugging Face base measured beside its training, as a run


def _validate(config: dict[str, Any]) -> None:
    from snakemake.utils import validate as snakemake_validate

    refuse_moved_keys(config)
    try:
        with tempfile.TemporaryDirectory(prefix="lmpipe_schema_") as tmp:
            schema = Path(tmp) / "config.schema.yaml"  # generated: lmpipe.config_schema
            schema.write_text(config_schema.render())
            snakemake_validate(config, str(schema))
    except Exception as e:
        error = _schema_error(e)
        if error is None:
            raise
        raise ConfigError(explain(error) + SCHEMA_HINT) from None
    validate_registry_sections(config)
    check_config(config)


def validate_registry_sections(config: dict[str, Any]) -> None:
    """What the schema cannot say of the registry's parts: a model's arch and its keys (which
    ones are allowed depends on the arch: lmpipe.config.model_config, the one check of them), an
    optimizer by name (the error lists the known ones)."""
    for name, m in config["models"].items():
        model_config(m, f"models.{name}")
    for name, r in config["runs"].items():
        if r["train"] is not None:
            optimizer_settings(r["train"]["optimizer"], f"runs.{name}.train.optimizer")


def load_config(path: str | Path, overlays: list[str | Path] = ()) -> dict[str, Any]:
    """Read a config file, merge `overlays` over it as `snakemake --configfile` does (a site's
    settings, docs/cluster.md), and validate it (the same checks as the Snakefile's)."""
    with open(path) as f:
        config = yaml.safe_load(f)
    for overlay in overlays:
        config = merge(config, yaml.safe_load(Path(overlay).read_text()) or {})
    validate(config)
    return config


def merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Snakemake's --configfile merge: nested keys of `overlay` replace `base`'s."""
    out = dict(base)
    for k, v in overlay.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def check_muon(config: dict[str, Any], name: str, model: Any) -> None:
    """Muon orthogonalises the 2-D weights of the model's blocks: a model with none is refused
    (where the architecture counts them; otherwise the train job refuses it)."""
    r = config["runs"][name]
    count = ARCHITECTURES[model.arch].hidden_matrices
    if r["train"]["optimizer"]["name"] == "muon" and count is not None and count(model) == 0:
        raise ConfigError(
            f"runs.{name}.train.optimizer.name: muon orthogonalises the 2-D weights of the"
            f" model's blocks, and model {r['model']!r} ({model.arch}) has none: use adamw"
        )


# the keys of a model's shape (lmpipe.config.ModelConfig), which an `arch: hf` entry leaves out
HF_SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "padded_vocab_size")


def check_reference_run(config: dict[str, Any], name: str) -> None:
    """A reference run (train: null) evaluates a Hugging Face model on a text dataset's val
    shard: its model is an `arch: hf` entry, and it has nothing to fine-tune from."""
    r, where = config["runs"][name], f"runs.{name}"
    arch = config["models"][r["model"]]["arch"]
    if arch != "hf":
        raise ConfigError(
            f"{where}.train: null (a reference run) evaluates a Hugging Face model as it is, and"
            f" model {r['model']!r} is arch {arch!r}: give it `train:`, or name an `arch: hf` model"
        )
    if "base" in r or "sft" in r:
        raise ConfigError(f"{where}: a reference run (train: null) has no base or sft")
    if is_conversations(config, r["dataset"]):
        raise ConfigError(
            f"{where}.dataset: {r['dataset']!r} is conversations; a reference run is scored on"
            " a text dataset's val shard"
        )


def check_fine_tuning_run(config: dict[str, Any], name: str) -> None:
    """A fine-tuning run: conversations data, one base of the same model, steps from epochs."""
    r, where = config["runs"][name], f"runs.{name}"
    if "base" not in r or "sft" not in r:
        raise ConfigError(f"{where}: a fine-tuning run needs both `base:` and `sft:`")
    if not is_conversations(config, r["dataset"]):
        raise ConfigError(f"{where}.dataset: {r['dataset']!r} is not a `kind: conversations` one")
    if "max_steps" in r["train"]:
        raise ConfigError(f"{where}.train.max_steps: set by sft.epochs for a fine-tuning run")
    seq_len = config["datasets"][r["dataset"]]["seq_len"]
    if r["train"]["seq_len"] != seq_len:
        raise ConfigError(
            f"{where}.train.seq_len {r['train']['seq_len']} differs from datasets."
            f"{r['dataset']}.seq_len {seq_len} (one conversation a row of that length)"
        )
    base = r["base"]
    if bool(base.get("run")) == bool(base.get("hf")):
        raise ConfigError(f"{where}.base: give exactly one of `run` or `hf`")
    if base.get("run"):
        b = base["run"]
        if b not in config["runs"] or is_fine_tuning(config, b):
            raise ConfigError(f"{where}.base.run: {b!r} is not a pretraining run of `runs:`")
        if config["runs"][b]["model"] != r["model"]:
            raise ConfigError(
                f"{where}.model {r['model']!r} differs from its base run's"
                f" {config['runs'][b]['model']!r}"
            )
        datasets = {
            o["dataset"] for o in config["runs"].values() if o.get("base", {}).get("run") == b
        }
        if len(datasets) > 1:
            raise ConfigError(
                f"runs: base run {b!r} is fine-tuned on several conversation datasets"
                f" {sorted(datasets)}; its chat evaluations support one"
            )
    else:
        text = base.get("dataset")
        if text and text not in config["datasets"]:
            raise ConfigError(
                f"{where}.base.dataset: unknown dataset {text!r}"
                f"{did_you_mean(text, config['datasets'])}"
            )
        if not text or is_conversations(config, text):
            raise ConfigError(f"{where}.base.dataset: an `hf` base needs a text dataset (val loss)")
        check_hf_base(config, name)


def check_hf_base(config: dict[str, Any], name: str) -> None:
    """`base: {hf: DIR}`: a run of our own GPT-2 model reads GPT-2 folders only; any other
    causal LM is fine-tuned as `model.arch: hf` (its folder checked by lmpipe.hf_folder)."""
    from lmpipe import hf_folder

    r, where = config["runs"][name], f"runs.{name}.base.hf"
    folder = r["base"]["hf"]
    arch = config["models"][r["model"]].get("arch", "gpt2")
    if arch == "hf":
        from lmpipe.config import hub_models

        if any(config["models"][m]["path"] == folder for m in hub_models(config)):
            return  # the download stage fetches it, and checks it as it lands (lmpipe.models.hub)
        try:
            hf_folder.check_folder(hf_folder.resolve(folder), False)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        return
    cfg = Path(folder) / "config.json"
    if cfg.is_file():
        found = json.loads(cfg.read_text())
        kind = found.get("lmpipe_arch") or found.get("model_type")
        if kind != arch:
            raise ConfigError(
                f"{where}: {cfg} is a {kind} model, not the run's model.arch {arch!r}: fine-tune"
                f" it with a model of `arch: hf, path: {folder}`"
            )


# the train settings of the evaluations during training, now in each evaluation's own section
MOVED_TRAIN_KEYS = {
    "eval_every": "eval.hellaswag.during_training.every",
    "eval_items": "eval.hellaswag.during_training.items",
    "eval_tasks": "eval.suite.during_training.tasks",
    "eval_task_items": "eval.suite.during_training.items",
}


def refuse_moved_keys(config: dict[str, Any]) -> None:
    """A run's old `train.eval_*` key: one line naming the key that replaced it."""
    for name, r in (config.get("runs") or {}).items():
        train = r.get("train") if isinstance(r, dict) else None
        for key in train if isinstance(train, dict) else ():
            if key in MOVED_TRAIN_KEYS:
                raise ConfigError(
                    f"runs.{name}.train.{key}: moved to runs.{name}.{MOVED_TRAIN_KEYS[key]}"
                )


def check_evals(config: dict[str, Any], name: str, rc: Any) -> None:
    """A run's HellaSwag file is one of `hellaswag:`; the suite during training has tasks."""
    where = f"runs.{name}.eval"
    hellaswag = rc.eval["hellaswag"].file
    if hellaswag not in config["hellaswag"]:
        raise ConfigError(
            f"{where}.hellaswag.file: unknown HellaSwag file {hellaswag!r}"
            f"{did_you_mean(hellaswag, config['hellaswag'])}"
        )
    suite = rc.eval["suite"]
    during = suite.during_training
    if during.every and not (during.tasks or suite.tasks):
        raise ConfigError(
            f"{where}.suite.during_training: every is {during.every} but there are no tasks:"
            " set during_training.tasks (or the section's tasks)"
        )


# a dataset's keys of its own data, which a mixture (made of its sources') has not
MIXTURE_REFUSES = {"source", "path", "repo", "name", "shard_tokens", "val_tokens", "approx_tokens"}


def check_mixture(config: dict[str, Any], name: str) -> None:
    """A mixture's weights are positive numbers of text datasets that are not mixtures."""
    where = f"datasets.{name}.mixture"
    own = sorted(MIXTURE_REFUSES & config["datasets"][name].keys())
    if own:
        raise ConfigError(
            f"datasets.{name}: a mixture is its sources' data; {', '.join(own)} belong to a"
            " source of its own (a dataset of the mixture)"
        )
    for source, weight in config["datasets"][name]["mixture"].items():
        if source not in config["datasets"]:
            raise ConfigError(
                f"{where}.{source}: unknown dataset {source!r}"
                f"{did_you_mean(source, config['datasets'])}"
            )
        if is_mixture(config, source):
            raise ConfigError(
                f"{where}.{source}: {source!r} is a mixture itself; a mixture's sources are"
                " tokenized datasets (list its sources here instead)"
            )
        if is_conversations(config, source):
            raise ConfigError(f"{where}.{source}: {source!r} is conversations, not text")
        if not weight > 0:
            raise ConfigError(
                f"{where}.{source}: weight {weight} is not positive (a source's share of the"
                " rows; leave a source out rather than weigh it 0)"
            )


def check_datasets(config: dict[str, Any]) -> None:
    """A dataset's source has what it needs: a path, a repo (and a text dataset's subset)."""
    for name, d in config["datasets"].items():
        where = f"datasets.{name}"
        if is_mixture(config, name):
            check_mixture(config, name)
            continue
        if d["source"] == "local" and not d.get("path"):
            raise ConfigError(f"{where}: source 'local' needs `path`")
        if is_conversations(config, name):  # a ShareGPT dataset needs no subset name
            if d["source"] == "huggingface" and not d.get("repo"):
                raise ConfigError(f"{where}: source 'huggingface' needs `repo`")
            continue
        if d["source"] == "huggingface" and not (d.get("repo") and d.get("name")):
            raise ConfigError(f"{where}: source 'huggingface' needs `repo` and `name`")


def check_models(config: dict[str, Any]) -> None:
    """A shape's heads divide its width and its padding holds its vocabulary; an `arch: hf`
    entry has no shape (its config.json's)."""
    for name, m in config["models"].items():
        if m["arch"] == "hf":  # its shape is its config.json's (read by model_config)
            shape = [k for k in HF_SHAPE_KEYS if k in m]
            if shape:
                raise ConfigError(
                    f"models.{name}.{shape[0]}: an `arch: hf` model's shape is its config.json's"
                    f" ({m['path']}); leave {', '.join(shape)} out"
                )
            continue
        if m["n_embd"] % m["n_head"]:
            raise ConfigError(
                f"models.{name}: n_embd {m['n_embd']} is not divisible by n_head {m['n_head']}"
            )
        if m["padded_vocab_size"] < m["vocab_size"]:
            raise ConfigError(f"models.{name}: padded_vocab_size is below vocab_size")


def pattern_problem(pattern: str) -> str | None:
    """Why a split regex does not compile in the engine that runs it (tokenizers' Oniguruma),
    or None."""
    from tokenizers import Regex

    try:
        Regex(pattern)
    except Exception as e:  # tokenizers raises a bare Exception
        return str(e).splitlines()[0]
    return None


def check_trained_tokenizers(config: dict[str, Any]) -> None:
    """Each `tokenizers:` entry: a text dataset, room for the bytes and its special tokens, an
    end of text, a pattern that compiles; each model's `tokenizer:` one of them, its vocabulary
    the tokenizer's (our own architectures only: an `arch: hf` model has its own)."""
    for name, t in config["tokenizers"].items():
        where = f"tokenizers.{name}"
        d = t["dataset"]
        if d not in config["datasets"]:
            raise ConfigError(
                f"{where}.dataset: unknown dataset {d!r}{did_you_mean(d, config['datasets'])}"
            )
        if is_mixture(config, d) or is_conversations(config, d):
            raise ConfigError(f"{where}.dataset: {d!r} is not a text dataset (raw text files)")
        specials = t["special_tokens"]
        if len(set(specials)) != len(specials):
            raise ConfigError(f"{where}.special_tokens: {specials} repeats a token")
        if EOT not in specials:
            raise ConfigError(f"{where}.special_tokens: {specials} lacks {EOT} (ends a document)")
        if t["vocab_size"] < BYTE_ALPHABET + len(specials):
            raise ConfigError(
                f"{where}.vocab_size {t['vocab_size']} is below the {BYTE_ALPHABET} bytes and"
                f" {len(specials)} special token(s): at least {BYTE_ALPHABET + len(specials)}"
            )
        pattern = SPLIT_PATTERNS.get(t["pattern"], t["pattern"])
        if (problem := pattern_problem(pattern)) is not None:
            raise ConfigError(f"{where}.pattern {t['pattern']!r} does not compile: {problem}")
    for name, m in config["models"].items():
        if not (tok := m.get("tokenizer")):
            continue
        where = f"models.{name}"
        if m["arch"] == "hf":
            raise ConfigError(f"{where}.tokenizer: an `arch: hf` model reads its own tokenizer")
        if tok not in config["tokenizers"]:
            raise ConfigError(
                f"{where}.tokenizer: unknown tokenizer {tok!r}"
                f"{did_you_mean(tok, config['tokenizers'])} (of `tokenizers:`)"
            )
        vocab = config["tokenizers"][tok]["vocab_size"]
        if m["vocab_size"] != vocab:
            raise ConfigError(
                f"{where}.vocab_size {m['vocab_size']} is not tokenizer {tok!r}'s {vocab}: set"
                f" vocab_size: {vocab} (and padded_vocab_size: {-(-vocab // 128) * 128})"
            )


def check_compile(where: str, rc: Any, fine_tuning: bool) -> None:
    """train.compile_scope and compile_mode: meaningful only under compile; CUDA graphs on CUDA
    only, and never for fine-tuning, whose head runs on a count of positions that changes each
    step (a CUDA graph holds one shape)."""
    t = rc.train
    for key in ("compile_scope", "compile_mode"):
        if not t.compile and getattr(t, key) != ADDED_TRAIN_KEYS[key]:
            raise ConfigError(
                f"{where}.train.{key} is {getattr(t, key)!r} but train.compile is false: set"
                " compile: true, or leave the key out"
            )
    problem = compile_problem(t.compile_mode, rc.launch.device)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    problem = loss_kernel_problem(t.loss_kernel, rc.launch.device)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    if t.loss_kernel != "pytorch" and t.loss_chunk_tokens:
        raise ConfigError(
            f"{where}.train.loss_chunk_tokens {t.loss_chunk_tokens}: loss_kernel"
            f" {t.loss_kernel!r} never holds the logits; leave loss_chunk_tokens 0"
        )
    if fine_tuning and t.compile_mode in CUDA_GRAPH_MODES:
        raise ConfigError(
            f"{where}.train.compile_mode {t.compile_mode!r}: CUDA graphs need static shapes, and"
            " a fine-tuning run's head runs on the counted positions, a count a step"
        )


def check_precision(where: str, rc: Any) -> None:
    """train.embedding_dtype bfloat16 only with bf16 compute (the tables' bf16 lookups would
    otherwise meet fp32 weights), and not with the whole model compiled as one graph (the
    tables are an FSDP unit of their own, whose hooks Dynamo never traces: the graph would
    break at the stem). A head tied to the token embedding is refused by the trainer
    (lmpipe.train.parallel.keep_embeddings_in_bf16), which sees the built model's ties."""
    t = rc.train
    if t.embedding_dtype != "bfloat16":
        return
    if t.dtype != "bfloat16":
        raise ConfigError(
            f"{where}.train.embedding_dtype bfloat16 needs train.dtype bfloat16 (the tables'"
            f" bf16 lookups would meet {t.dtype} weights): set dtype bfloat16, or leave"
            " embedding_dtype out"
        )
    if t.compile and t.compile_scope == "model":
        raise ConfigError(
            f"{where}.train.embedding_dtype bfloat16 shards the embedding tables as an FSDP unit"
            " of their own, whose hooks would break compile_scope 'model''s one graph: use"
            " compile_scope regions or blocks"
        )


def check_tokenizers(config: dict[str, Any]) -> None:
    """Each `arch: hf` model's tokenizer that some run reads, loaded as its jobs will load it
    (lmpipe.hf_config.check_tokenizer: an eos, ids within the embedding, and the Vicuna
    template where the model meets conversations), before any job. A hub model not downloaded
    yet is checked by the jobs that read it."""
    from lmpipe.config import chat_dataset, hf_tokenizer_folder
    from lmpipe.hf_config import check_tokenizer

    chats: dict[str, bool] = {}
    for name, r in config["runs"].items():
        if config["models"][r["model"]]["arch"] == "hf":
            chat = chat_dataset(config, name) is not None
            chats[r["model"]] = chats.get(r["model"], False) or chat
    for model, chat in sorted(chats.items()):
        folder = Path(hf_tokenizer_folder(config, model))
        if not (folder / "config.json").is_file():
            continue
        try:
            check_tokenizer(folder, template=chat)
        except ValueError as e:
            raise ConfigError(f"models.{model}: {e}") from None


def check_chat_in_trained_tokenizers(config: dict[str, Any]) -> None:
    """Each trained tokenizer some run's conversations are prepared in writes the Vicuna
    template as its rows are tokenized: its `<|endoftext|>` (the eos; check_trained_tokenizers
    requires it) ends each reply, the template's </s>, as GPT-2's does; and its split regex cuts
    a prompt's end from its reply (lmpipe.data.chat_format.split_problem), so the export's
    `apply_chat_template` gives the ids the model was fine-tuned on. Before the tokenizer is
    trained: its settings tell."""
    from lmpipe.config import chat_dataset
    from lmpipe.data.chat_format import split_problem

    for name, r in config["runs"].items():
        tok = config["models"][r["model"]].get("tokenizer")
        if not tok or chat_dataset(config, name) is None:
            continue
        pattern = config["tokenizers"][tok]["pattern"]
        if (problem := split_problem(SPLIT_PATTERNS.get(pattern, pattern))) is not None:
            raise ConfigError(
                f"tokenizers.{tok}.pattern {pattern!r} cannot write the Vicuna template of run"
                f" {name!r}'s conversations: {problem}"
            )


def check_config(config: dict[str, Any]) -> None:
    """Checks across fields and sections; each error names the YAML path and the value."""
    check_datasets(config)
    check_models(config)
    check_trained_tokenizers(config)
    for name, r in config["runs"].items():
        where = f"runs.{name}"
        if r["dataset"] not in config["datasets"]:
            raise ConfigError(
                f"{where}.dataset: unknown dataset {r['dataset']!r}"
                f"{did_you_mean(r['dataset'], config['datasets'])}"
            )
        if r["model"] not in config["models"]:
            raise ConfigError(
                f"{where}.model: unknown model {r['model']!r}"
                f"{did_you_mean(r['model'], config['models'])}"
            )
        if r["train"] is None:
            check_reference_run(config, name)
            check_evals(config, name, run_config(config, name))
            continue
        if "base" in r or "sft" in r:
            check_fine_tuning_run(config, name)
        elif is_conversations(config, r["dataset"]):
            raise ConfigError(f"{where}: dataset {r['dataset']!r} is conversations: add base/sft")
        elif "max_steps" not in r["train"]:
            raise ConfigError(f"{where}.train: 'max_steps' is required")
        rc = run_config(config, name)
        check_muon(config, name, rc.model)
        if rc.train.seq_len > rc.model.block_size:
            raise ConfigError(
                f"{where}.train.seq_len {rc.train.seq_len} exceeds the model's block_size"
                f" {rc.model.block_size}"
            )
        try:
            rc.train.grad_accum_steps(rc.launch.world_size)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        check_compile(where, rc, fine_tuning=is_fine_tuning(config, name))
        check_precision(where, rc)
        sched = rc.train.schedule
        if rc.train.max_steps and sched.warmup_steps + sched.cooldown_steps > rc.train.max_steps:
            raise ConfigError(
                f"{where}.train.schedule: warmup_steps {sched.warmup_steps} + cooldown_steps"
                f" {sched.cooldown_steps} exceed max_steps {rc.train.max_steps}"
            )
        check_evals(config, name, rc)
    check_tokenizers(config)
    check_chat_in_trained_tokenizers(config)
    for name, rep in config["reports"].items():
        for run in rep["runs"]:
            if run not in config["runs"]:
                raise ConfigError(
                    f"reports.{name}.runs: unknown run {run!r}{did_you_mean(run, config['runs'])}"
                )
        check_comparisons(name, rep)


def check_comparisons(report: str, rep: dict[str, Any]) -> None:
    """A report's `compare` pairs name its runs (a replicated run by its recipe's name), each
    run compared against one baseline at most, never against itself."""
    names = list(dict.fromkeys(replicas.recipe_of(r) for r in rep["runs"]))
    against: dict[str, str] = {}
    for i, (base, other) in enumerate(rep.get("compare") or []):
        where = f"reports.{report}.compare[{i}]"
        for run in (base, other):
            if run not in names:
                raise ConfigError(
                    f"{where}: {run!r} is not a run of this report{did_you_mean(run, names)}"
                )
        if base == other:
            raise ConfigError(f"{where}: {base!r} against itself")
        if other in against:
            raise ConfigError(
                f"{where}: {other!r} is already compared against {against[other]!r};"
                " a run has one baseline (put it first in another pair to compare it again)"
            )
        against[other] = base


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Check a config file, or print the schema.")
    p.add_argument("config", nargs="?", default="config/config.yaml")
    p.add_argument("--print", action="store_true", help="print the schema (YAML)")
    args = p.parse_args(argv)
    if args.print:
        print(config_schema.render(), end="")
        return 0
    try:
        load_config(args.config)
    except ConfigError as e:
        print(f"{args.config}: {e}", file=sys.stderr)
        return 1
    print(f"{args.config}: valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
