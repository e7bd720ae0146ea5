"""Checking a config before any job starts: the schema, the registry's sections, cross-field rules.

- `validate(config)` runs Snakemake's own `validate()` against workflow/schemas/config.schema.yaml
  (filling in defaults), then checks the sections whose keys come from lmpipe.registry (an
  optimizer's settings, a run's evaluation sections) against schemas built from their
  dataclasses, then the cross-field rules a schema cannot express. Any error is a ConfigError of
  one line naming the YAML path, the key and, for a typo, the nearest valid key.
- `load_config(path)`: a file read and validated as the Snakefile does it.

    python -m lmpipe.schema config/config.yaml   # check a config: one line for a problem
    python -m lmpipe.schema --print               # the whole schema, generated parts included

The Snakefile and the by-hand tools use this module; the stage jobs do not (their conda envs
hold neither Snakemake nor jsonschema): they get the checked slices (lmpipe.config).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, ValidationError, validators

from lmpipe import sweeps
from lmpipe.config import (
    ConfigError,
    did_you_mean,
    is_conversations,
    is_fine_tuning,
    model_class,
    optimizer_settings,
    run_config,
    unknown_model_key,
)
from lmpipe.paths import SCHEMA
from lmpipe.registry import ARCHITECTURES, EVAL_SECTIONS, OPTIMIZERS

SCHEMA_HINT = "  [python -m lmpipe.schema --print shows every key]"


JSON_TYPES = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}


def field_schema(cls: type, f: dataclasses.Field) -> dict[str, Any]:
    """One field's JSON schema (its type and the constraints of its `setting()`); a field whose
    type is a settings dataclass is an object of that dataclass's schema."""
    prop = {k: v for k, v in f.metadata.items() if v != ""}
    nested = typing.get_type_hints(cls)[f.name]
    if dataclasses.is_dataclass(nested):
        return section_schema(nested) | prop
    hint = str(f.type)
    nullable = hint.endswith(" | None")
    hint = hint.removesuffix(" | None")
    if hint in JSON_TYPES:
        prop["type"] = JSON_TYPES[hint]
    elif hint.startswith("list[") and hint[5:-1] in JSON_TYPES:
        prop |= {"type": "array", "items": {"type": JSON_TYPES[hint[5:-1]]} | prop.get("items", {})}
    elif hint.startswith("tuple["):
        n = hint.count(",") + 1
        prop |= {"type": "array", "items": {"type": "number"}, "minItems": n, "maxItems": n}
    else:
        raise TypeError(f"{cls.__name__}.{f.name}: no JSON type for {hint}")
    if nullable:
        prop["type"] = [prop["type"], "null"]
    return prop


def section_schema(cls: type) -> dict[str, Any]:
    """The JSON schema of a registry settings dataclass: types, defaults and constraints from its
    fields (lmpipe.registry.setting), unknown keys refused; a nested settings dataclass is a
    nested object, its default its fields' defaults."""
    props, required_ = {}, []
    for f in dataclasses.fields(cls):
        prop = field_schema(cls, f)
        if f.default is not dataclasses.MISSING:
            default = f.default
            if dataclasses.is_dataclass(default):
                default = dataclasses.asdict(default)
            prop["default"] = list(default) if isinstance(default, tuple) else default
        elif f.default_factory is not dataclasses.MISSING:
            prop["default"] = f.default_factory()
        else:
            required_.append(f.name)
        props[f.name] = prop
    return {
        "type": "object",
        "additionalProperties": False,
        "required": required_,
        "properties": props,
        "description": (cls.__doc__ or "").strip(),
    }


def _validator(schema: dict[str, Any]):
    """jsonschema's validator that fills in defaults, as Snakemake's validate() does."""
    properties = Draft202012Validator.VALIDATORS["properties"]

    def set_defaults(validator, props, instance, schema_):
        for name, sub in props.items():
            if "default" in sub and isinstance(instance, dict):
                instance.setdefault(name, json.loads(json.dumps(sub["default"])))
        yield from properties(validator, props, instance, schema_)

    return validators.extend(Draft202012Validator, {"properties": set_defaults})(schema)


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
    """Validate `config` in place (defaults filled in), then expand its sweeps into runs and
    validate those as runs (lmpipe.sweeps); a ConfigError names the first problem."""
    _validate(config)
    if sweeps.expand(config):
        _validate(config)  # the points are runs: every check a run gets


def _validate(config: dict[str, Any]) -> None:
    from snakemake.utils import validate as snakemake_validate

    refuse_moved_keys(config)
    try:
        snakemake_validate(config, str(SCHEMA))
    except Exception as e:
        error = _schema_error(e)
        if error is None:
            raise
        raise ConfigError(explain(error) + SCHEMA_HINT) from None
    validate_registry_sections(config)
    check_config(config)


def _check_section(data: dict[str, Any], schema: dict[str, Any], where: str) -> None:
    validator = _validator(schema)
    for error in validator.iter_errors(data):
        raise ConfigError(explain(error, where) + SCHEMA_HINT)


def validate_model(name: str, m: dict[str, Any]) -> None:
    """A `models:` entry: a known arch, and keys beyond the shape (the schema file's) only of its
    settings (lmpipe.registry Architecture.settings), checked against their schema."""
    where = f"models.{name}"
    if m["arch"] not in ARCHITECTURES:
        raise ConfigError(
            f"{where}.arch: unknown architecture {m['arch']!r}"
            f"{did_you_mean(m['arch'], ARCHITECTURES)} (known: {', '.join(ARCHITECTURES)})"
        )
    settings = ARCHITECTURES[m["arch"]].settings
    shape = {f.name for f in dataclasses.fields(model_class("gpt2"))}
    known = [f.name for f in dataclasses.fields(model_class(m["arch"]))]
    for key in m:
        if key not in known:
            raise ConfigError(f"{where}: {unknown_model_key(key, m['arch'], known)}")
    if settings is not None:
        own = {k: v for k, v in m.items() if k not in shape}
        _check_section(own, section_schema(settings), where)
        m.update(own)  # its defaults filled in, as the schema does for every other key


def validate_registry_sections(config: dict[str, Any]) -> None:
    """Model settings, optimizer settings and evaluation sections, against their registry
    dataclasses."""
    for name, m in config["models"].items():
        validate_model(name, m)
    for name, r in config["runs"].items():
        opt = r["train"]["optimizer"]
        where = f"runs.{name}.train.optimizer"
        _check_section(opt, section_schema(optimizer_settings(opt, where)), where)
        evals = r.setdefault("eval", {})
        for section in evals:
            if section not in EVAL_SECTIONS:
                raise ConfigError(
                    f"runs.{name}.eval: unknown key {section!r}"
                    f"{did_you_mean(section, EVAL_SECTIONS)}"
                    f" (sections: {', '.join(EVAL_SECTIONS)})"
                )
        for section, cls in EVAL_SECTIONS.items():
            _check_section(
                evals.setdefault(section, {}), section_schema(cls), f"runs.{name}.eval.{section}"
            )


def full_schema() -> dict[str, Any]:
    """The schema file plus the parts built from lmpipe.registry (for reading, not validating)."""
    schema = yaml.safe_load(SCHEMA.read_text())
    defs = schema["definitions"]
    defs["optimizer"] = {"oneOf": [section_schema(o.settings) for o in OPTIMIZERS.values()]}
    model = defs["model"]
    model["additionalProperties"] = False  # the architectures' settings, each marked with its arch
    for arch in ARCHITECTURES.values():
        if arch.settings is not None:
            for key, prop in section_schema(arch.settings)["properties"].items():
                prop["description"] = f"(model.arch {arch.name}) {prop.get('description', '')}"
                model["properties"][key] = prop
    defs["eval"] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {s: section_schema(c) for s, c in EVAL_SECTIONS.items()},
    }
    return schema


def load_config(path: str | Path) -> dict[str, Any]:
    """Read and validate a config file (the same checks as the Snakefile's)."""
    with open(path) as f:
        config = yaml.safe_load(f)
    validate(config)
    return config


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


def check_datasets(config: dict[str, Any]) -> None:
    """A dataset's source has what it needs: a path, a repo (and a text dataset's subset)."""
    for name, d in config["datasets"].items():
        where = f"datasets.{name}"
        if d["source"] == "local" and not d.get("path"):
            raise ConfigError(f"{where}: source 'local' needs `path`")
        if is_conversations(config, name):  # a ShareGPT dataset needs no subset name
            if d["source"] == "huggingface" and not d.get("repo"):
                raise ConfigError(f"{where}: source 'huggingface' needs `repo`")
            continue
        if d["source"] == "huggingface" and not (d.get("repo") and d.get("name")):
            raise ConfigError(f"{where}: source 'huggingface' needs `repo` and `name`")


def check_config(config: dict[str, Any]) -> None:
    """Checks across fields and sections; each error names the YAML path and the value."""
    check_datasets(config)
    for name, m in config["models"].items():
        if m["n_embd"] % m["n_head"]:
            raise ConfigError(
                f"models.{name}: n_embd {m['n_embd']} is not divisible by n_head {m['n_head']}"
            )
        if m["padded_vocab_size"] < m["vocab_size"]:
            raise ConfigError(f"models.{name}: padded_vocab_size is below vocab_size")
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
        sched = rc.train.schedule
        if rc.train.max_steps and sched.warmup_steps + sched.cooldown_steps > rc.train.max_steps:
            raise ConfigError(
                f"{where}.train.schedule: warmup_steps {sched.warmup_steps} + cooldown_steps"
                f" {sched.cooldown_steps} exceed max_steps {rc.train.max_steps}"
            )
        check_evals(config, name, rc)
    for name, rep in config["reports"].items():
        for run in rep["runs"]:
            if run not in config["runs"]:
                raise ConfigError(
                    f"reports.{name}.runs: unknown run {run!r}{did_you_mean(run, config['runs'])}"
                )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Check a config file, or print the schema.")
    p.add_argument("config", nargs="?", default="config/config.yaml")
    p.add_argument("--print", action="store_true", help="print the full schema (YAML)")
    args = p.parse_args(argv)
    if args.print:
        print(yaml.safe_dump(full_schema(), sort_keys=False))
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
