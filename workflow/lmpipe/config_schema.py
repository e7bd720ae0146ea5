"""The config's JSON schema, generated from the settings' dataclasses whenever a config is checked.

Each setting is a field of a dataclass (lmpipe.config's sections, lmpipe.registry's optimizer,
evaluation and architecture settings; lmpipe.settings reads a field's type, default,
description and constraints). What is structure rather than a setting is written below: the top
level, the maps of named entries, a run's shape (its `model` a name), a dataset's
kind-dependent required keys, a sweep's and a report's keys. lmpipe.schema writes it to a
temporary file for Snakemake's validate(), so Snakemake stays the checker, and nothing generated
is kept in the repository: a new setting, evaluation section or suite task is checked as soon as
its dataclass or table has it.

    python -m lmpipe.schema --print   # the schema, as Snakemake reads it

Torch-free and without jsonschema: it builds dicts and writes YAML.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import yaml

from lmpipe.config import (
    BaseConfig,
    ConversationsConfig,
    LaunchConfig,
    LoggingConfig,
    ModelConfig,
    SFTConfig,
    Source,
    SourceConfig,
    TokenizeConfig,
    TokenizerConfig,
    TrainConfig,
)
from lmpipe.registry import ARCHITECTURES, EVAL_SECTIONS, OPTIMIZERS
from lmpipe.settings import section_schema

HEADER = """\
# GENERATED from the dataclasses of lmpipe/config.py and lmpipe/registry.py
# (lmpipe/config_schema.py) each time a config is checked: `python -m lmpipe.schema --print`.
"""

DESCRIPTION = (
    "lmpipe configuration (config/config.yaml). Every object refuses unknown keys, so a typo is"
    " an error that names the key; Snakemake's validate() fills in the defaults given here. Each"
    " setting is a field of a dataclass of lmpipe/config.py or lmpipe/registry.py (an"
    " optimizer's settings, an architecture's, a run's evaluation sections), and this file is"
    " generated from them: `python -m lmpipe.schema --print`. The checks a schema cannot express"
    " (an unknown optimizer or architecture by name, a model key of another architecture,"
    " references between entries) follow in lmpipe.schema: `python -m lmpipe.schema FILE`"
    " checks a config."
)

# a text dataset's and a conversations dataset's settings; `dataset` is the entry's name
DATASET_PARTS = (SourceConfig, TokenizeConfig, ConversationsConfig)
ENTRY_NAME = "dataset"


def ref(definition: str, **more: Any) -> dict[str, Any]:
    return {"$ref": f"#/definitions/{definition}", **more}


def _branch(selector: str, value: str, then: dict[str, Any]) -> dict[str, Any]:
    """Apply `then` where the object's `selector` is `value` (an optimizer's name, a model's
    arch): its settings' types, constraints and defaults."""
    when = {"properties": {selector: {"const": value}}, "required": [selector]}
    return {"if": when, "then": then}


def dataset_schema() -> dict[str, Any]:
    """A `datasets:` entry: the keys of a text and of a conversations dataset together; `kind`
    picks which are required."""
    props: dict[str, Any] = {
        "kind": {
            "description": "text or ShareGPT conversations",
            "enum": ["text", "conversations"],
            "default": "text",
        }
    }
    for part in DATASET_PARTS:
        props |= section_schema(part)["properties"]
    del props[ENTRY_NAME]
    props["approx_tokens"] = {
        "description": "for the plan only (lmpipe.plan): about how many tokens the dataset"
        " holds; changes no job",
        "type": "number",
        "exclusiveMinimum": 0,
    }
    props["approx_conversations"] = {
        "description": "for the plan only: about how many conversations a hub conversations"
        " dataset holds (a fine-tuning run's steps before it is downloaded); changes no job",
        "type": "integer",
        "minimum": 1,
    }
    props["mixture"] = {
        "description": "a mixture of other (text) datasets: name -> weight (or tokens); each"
        " step's rows are drawn from them in proportion (lmpipe.data.mixture)",
        "type": "object",
        "minProperties": 1,
        "additionalProperties": {"type": "number"},
    }
    common = _required(Source)
    own = {
        "required": common,
        # text (pretraining: llm.c shards) needs shard sizes; conversations (SFT) a row length
        "if": {"properties": {"kind": {"const": "conversations"}}, "required": ["kind"]},
        "then": {"required": [k for k in _required(ConversationsConfig) if k not in common]},
        "else": {"required": _required(TokenizeConfig)},
    }
    return {
        "type": "object",
        "additionalProperties": False,
        # a mixture needs nothing else; a dataset of its own, its source and shard sizes
        "if": {"required": ["mixture"]},
        "else": own,
        "properties": props,
    }


def _entry(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """An entry's schema less its `name` field, which is its key in the map, not a setting."""
    schema["properties"].pop(name)
    schema["required"] = [k for k in schema.get("required", []) if k != name]
    return schema


def _required(cls: type) -> list[str]:
    return [k for k in section_schema(cls).get("required", []) if k != ENTRY_NAME]


def model_schema() -> dict[str, Any]:
    """A `models:` entry: the shape, and the settings of its arch (lmpipe.registry
    Architecture.settings). Which other keys are refused depends on the arch: lmpipe.config's
    model_config checks them, naming the arch a key belongs to."""
    shape = section_schema(ModelConfig)
    arch = shape["properties"].pop("arch")
    hf_settings = ARCHITECTURES["hf"].settings  # its settings replace the shape (lmpipe.hf_config)
    hf = _branch("arch", "hf", {"properties": section_schema(hf_settings)["properties"]})
    hf["then"]["required"] = ["path"]
    hf["else"] = {"properties": shape["properties"], "required": shape["required"]}
    return {
        "type": "object",
        "description": shape.get("description", ""),
        "additionalProperties": True,
        "properties": {"arch": arch},
        "allOf": [hf]
        + [
            _branch("arch", a.name, {"properties": section_schema(a.settings)["properties"]})
            for a in ARCHITECTURES.values()
            if a.settings is not None and a.name != "hf"
        ],
    }


def _without_default(prop: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in prop.items() if k != "default"}


def optimizer_schema() -> dict[str, Any]:
    """train.optimizer: a name and that optimizer's settings. An unknown name is lmpipe.schema's
    error (it names the known ones)."""
    return {
        "type": "object",
        "required": ["name", "lr"],
        "properties": {"name": {"type": "string"}},
        "allOf": [_branch("name", o.name, section_schema(o.settings)) for o in OPTIMIZERS.values()],
    }


def eval_schema() -> dict[str, Any]:
    """A run's `eval:`: one section an evaluation family (lmpipe.registry.EVAL_SECTIONS)."""
    return {
        "description": "one section an evaluation family; each evaluation's job depends on its"
        " own section only",
        "type": "object",
        "additionalProperties": False,
        "properties": {s: section_schema(c) | {"default": {}} for s, c in EVAL_SECTIONS.items()},
    }


def run_schema() -> dict[str, Any]:
    """A `runs:` entry: a dataset and a model by name, and its sections."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["dataset", "model", "train", "launch"],
        "properties": {
            "dataset": {"description": "a key of `datasets:`", "type": "string"},
            "model": {"description": "a key of `models:`", "type": "string"},
            "train": {
                "description": "training settings; null: a reference run (a Hugging Face"
                " model evaluated as it is, never trained)",
                "if": {"type": "object"},
                "then": ref("train"),
                "else": {"type": "null"},
            },
            "launch": ref("launch"),
            "eval": ref("eval", default={}),
            "logging": ref("logging", default={}),
            "base": section_schema(BaseConfig),
            "sft": section_schema(SFTConfig),
            "seeds": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "minItems": 1,
                "description": "train the run once a seed (lmpipe.replicas): runs <run>/seed=N,"
                " each with train.seed N; a report treats them as one recipe",
            },
        },
    }


# a report's (and a sweep's) price: one figure for any GPU, or one a GPU type, matched against a
# run's launch.gpu_model as the peaks are (lmpipe.costs.gpu_hour_price)
GPU_HOUR_PRICE = {
    "oneOf": [
        {"type": "number", "minimum": 0},
        {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "number", "minimum": 0},
        },
    ],
    "default": 0.0,
    "description": "USD per GPU-hour: one figure, or one a GPU type (e.g. {a100: 2.0, h100: 3.0})",
}

SWEEP = {
    "type": "object",
    "additionalProperties": False,
    "required": ["base"],
    "description": "many runs from one entry (lmpipe.sweeps): the base run with dotted keys"
    " replaced, one run a point, named by its own values (sweep/key=value_key=value), and the"
    " report sweep-<name>",
    "properties": {
        "base": {"type": "string", "description": "the run every point starts from"},
        "grid": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "array", "minItems": 1},
            "description": "dotted key of the run -> its values; every combination is a point",
        },
        "points": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object", "minProperties": 1},
            "description": "explicit points, each {dotted key: value}",
        },
        "tokens_per_param": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "a size ladder: each point's train.max_steps = ceil(tokens_per_param *"
            " parameters / batch_tokens)",
        },
        "gpu_hour_price": GPU_HOUR_PRICE,
    },
}

REPORT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["runs"],
    "properties": {
        "runs": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "gpu_hour_price": GPU_HOUR_PRICE,
        "compare": {
            "type": "array",
            "items": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 2,
                "maxItems": 2,
            },
            "description": "the pairs the verdict compares, [baseline, run] (a replicated run by"
            " its name); default: every run against the first",
        },
    },
}

TOP_LEVEL = {
    "paths": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "results": {"type": "string", "default": "results"},
            "data": {"type": "string", "default": "results/data"},
        },
    },
    "tokenizer": {"type": "string", "default": "resources/gpt2"},
    "cluster": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "description": "what the plan (lmpipe.plan) and the derived time limits know of the"
        " cluster",
        "properties": {
            "max_runtime": {
                "type": "integer",
                "minimum": 1,
                "default": 2880,
                "description": "the partition's time limit, minutes: no derived limit asks for"
                " more, and the plan flags a job that needs more",
            },
            "downloads": {
                "enum": ["job", "local"],
                "default": "job",
                "description": "where the download stages run under a cluster executor: `job`, a"
                " job of their own (slurm/config.yaml sends them to LMPIPE_DOWNLOAD_PARTITION, a"
                " partition whose nodes reach the internet, else where every job goes), or"
                " `local`, where Snakemake itself runs (a login node), for a cluster none of"
                " whose compute nodes reaches the internet",
            },
        },
    },
    "hellaswag": {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "default": {"embedded": "resources/hellaswag_val_sample.jsonl"},
    },
    "datasets": {"type": "object", "additionalProperties": ref("dataset")},
    "models": {"type": "object", "additionalProperties": ref("model")},
    "tokenizers": {"type": "object", "default": {}, "additionalProperties": ref("tokenizer")},
    "runs": {"type": "object", "additionalProperties": ref("run")},
    "reports": {"type": "object", "additionalProperties": ref("report")},
    "sweeps": {"type": "object", "default": {}, "additionalProperties": ref("sweep")},
}


def config_schema() -> dict[str, Any]:
    """The whole schema of a config file."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "description": DESCRIPTION,
        "type": "object",
        "additionalProperties": False,
        "required": ["datasets", "models", "runs", "reports"],
        "definitions": {
            "dataset": dataset_schema(),
            "model": model_schema(),
            "tokenizer": _entry(section_schema(TokenizerConfig), "name"),
            "optimizer": optimizer_schema(),
            "train": section_schema(TrainConfig, optimizer=ref("optimizer")),
            "launch": section_schema(LaunchConfig),
            "logging": section_schema(LoggingConfig),
            "eval": eval_schema(),
            "run": run_schema(),
            "sweep": SWEEP,
            "report": REPORT,
        },
        "properties": TOP_LEVEL,
    }


class _Dumper(yaml.SafeDumper):
    """YAML for reading: lists of scalars on one line, long descriptions folded, no aliases."""

    def ignore_aliases(self, data: Any) -> bool:  # a list two settings share is written twice
        return True


def _list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(x, dict | list) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = ">" if len(data) > 80 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(list, _list)
_Dumper.add_representer(str, _str)


@cache
def render() -> str:
    """The schema file's text: the header, then the schema as YAML (block style, in the order
    written here)."""
    body = yaml.dump(
        config_schema(), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True
    )
    return HEADER + body
