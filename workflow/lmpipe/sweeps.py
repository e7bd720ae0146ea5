"""Sweeps: many runs from one config entry (`sweeps:`), expanded into ordinary runs.

A sweep names a base run and a grid of dotted keys (or a list of points). Each point is the base
run with those keys replaced, added to `runs:` under a name made of its own values only
(`lr/lr=3e-3_model=tiny`), so it is cached, scheduled and submitted like any run: adding a value
trains only the new point, removing one retrains nothing, and a change of the base reaches every
point that inherits it. A size ladder (`tokens_per_param`) sets each point's `train.max_steps` so
that the tokens it trains on are proportional to its parameters. Each sweep gets the report
`sweep-<name>` (lmpipe.report.sweep).

Torch-free: lmpipe.schema expands the sweeps right after validating the config and validates the
points as runs, before any rule reads `runs:`.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import re
from typing import Any

from lmpipe import config as lmconfig
from lmpipe.config import ConfigError, TokenizerConfig, did_you_mean
from lmpipe.registry import ARCHITECTURES

REPORT_PREFIX = "sweep-"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a sweep's name: a folder under runs/
VALUE = re.compile(r"[A-Za-z0-9._+-]+")  # a value as written in a point's name
# the pipeline's presets, where a size ladder's power law puts them, and the published figures
# (lmpipe.report.references) of llm.c's runs of them
PRESETS = {"124m": "llm.c GPT-2 124M", "350m": "llm.c GPT-2 350M"}
# a key `tokenizer.<setting>` sets the point's model's trained tokenizer's setting (tokenizer_point)
TOKENIZER = "tokenizer."
FIXED = ("name", "dataset")  # a tokenizer's settings a sweep keeps: its name, its text


def report_name(sweep: str) -> str:
    return f"{REPORT_PREFIX}{sweep}"


def sweep_of_report(config: dict[str, Any], report: str) -> str | None:
    """The sweep whose report `report` is, or None for an ordinary report."""
    name = report.removeprefix(REPORT_PREFIX)
    return name if report.startswith(REPORT_PREFIX) and name in config.get("sweeps", {}) else None


def format_value(value: Any) -> str:
    """A value as a point's name shows it: 3e-3, 1.2e-3, 0.5, 12, tiny, true, 0.9+0.95."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if value != 0 and not 0.1 <= abs(value) < 1e4:
            mantissa, exponent = f"{value:.6e}".split("e")
            return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return f"{value:g}"
    if isinstance(value, list):
        return "+".join(format_value(v) for v in value)
    return str(value)


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted key's name in point names: its last part (`lr`), or the whole key where two
    keys of the sweep share a last part."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last, strict=True)}


def points_of(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """The sweep's points, each {dotted key: value}: every combination of the grid (its keys in
    their order), or the explicit list."""
    if "grid" in sweep:
        keys, values = list(sweep["grid"]), sweep["grid"].values()
        return [dict(zip(keys, vs, strict=True)) for vs in itertools.product(*values)]
    return [dict(p) for p in sweep["points"]]


def point_name(sweep: str, point: dict[str, Any], short: dict[str, str]) -> str:
    """`sweep/key=value_key=value`: depends only on the point's own values (stable when a value
    is added to the sweep), safe in paths, wildcards and shells."""
    return f"{sweep}/" + "_".join(f"{short[k]}={format_value(v)}" for k, v in point.items())


def _flat_keys(d: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for k, v in d.items():
        keys.append(f"{prefix}{k}")
        if isinstance(v, dict):
            keys += _flat_keys(v, f"{prefix}{k}.")
    return keys


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number" if isinstance(value, float) else "an integer"
    names = {str: "a string", list: "a list", dict: "a mapping"}
    return names.get(type(value), type(value).__name__)


def _same_type(old: Any, new: Any) -> bool:
    """Whether `new` may replace `old` (an int where a float is; never a bool for a number)."""
    if old is None:
        return True  # an optional setting left unset: the point's validation as a run decides
    if isinstance(old, bool) or isinstance(new, bool):
        return isinstance(old, bool) and isinstance(new, bool)
    if isinstance(old, float):
        return isinstance(new, int | float)
    return isinstance(new, type(old))


def set_key(
    config: dict[str, Any], run: dict[str, Any], key: str, value: Any, where: str, base: str
) -> None:
    """Replace dotted `key` of `run` (a copy of the base) by `value`, checked against the base:
    the key must exist there, the value be of its type (a model: a name of `models:`)."""
    parts = key.split(".")
    node = run
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            hint = did_you_mean(key, _flat_keys(run))
            raise ConfigError(
                f"{where}: unknown key {key!r}: run {base!r} has no such setting{hint}"
            )
        if i < len(parts) - 1:
            node = node[part]
    old = node[parts[-1]]
    if not _same_type(old, value):
        number = isinstance(old, int | float) and isinstance(value, str)
        fix = " (YAML reads 3e-3 as a string: write 3.0e-3)" if number else ""
        raise ConfigError(
            f"{where}: {key} = {value!r} is {_type_name(value)}, not {_type_name(old)} like"
            f" run {base!r}'s {old!r}{fix}"
        )
    if key == "model" and value not in config["models"]:
        hint = did_you_mean(str(value), config["models"])
        raise ConfigError(f"{where}: model {value!r} is not in `models:`{hint}")
    if isinstance(value, str | list) and not VALUE.fullmatch(format_value(value)):
        raise ConfigError(
            f"{where}: {key} = {value!r} cannot name a point (letters, digits and . _ + - only)"
        )
    node[parts[-1]] = copy.deepcopy(value)


def tokenizer_point(
    config: dict[str, Any], run: dict[str, Any], settings: dict[str, Any], where: str, base: str
) -> None:
    """A point's `tokenizer.<setting>` keys: its model's trained tokenizer with those settings, as
    a `tokenizers:` entry of its own named by them (`embedded-4k-v2048`), and its model in it (a
    `models:` entry `tiny-tok4k-v2048`, the tokenizer's vocabulary); the run reads that model.
    Points with the same settings share the entry, so it is trained once; each is cached by its
    settings like any tokenizer, so adding a size trains only the new one."""
    model_name = run["model"]
    model = config["models"][model_name]
    if not (tok_name := model.get("tokenizer")):
        raise ConfigError(
            f"{where}: tokenizer.{next(iter(settings))} sets a trained tokenizer's setting, and"
            f" run {base!r}'s model {model_name!r} has no `tokenizer:`"
        )
    tok = copy.deepcopy(config["tokenizers"][tok_name])
    names = [f.name for f in dataclasses.fields(TokenizerConfig) if f.name not in FIXED]
    for key, value in settings.items():
        if key not in names:
            raise ConfigError(
                f"{where}: unknown key 'tokenizer.{key}': a trained tokenizer has no such"
                f" setting{did_you_mean(key, names)}"
            )
        tok[key] = copy.deepcopy(value)
    suffix = "_".join(
        f"{'v' if k == 'vocab_size' else k}{format_value(v)}" for k, v in settings.items()
    )
    config["tokenizers"][f"{tok_name}-{suffix}"] = tok
    vocab, padded = model["vocab_size"], model.get("padded_vocab_size")
    config["models"][f"{model_name}-{suffix}"] = model | {
        "tokenizer": f"{tok_name}-{suffix}",
        "vocab_size": tok["vocab_size"],
        # the base's padding kept: none, or up to a multiple of 128
        "padded_vocab_size": tok["vocab_size"] if padded in (None, vocab)
        else math.ceil(tok["vocab_size"] / 128) * 128,
    }  # fmt: skip
    run["model"] = f"{model_name}-{suffix}"


def ladder_steps(config: dict[str, Any], run: dict[str, Any], tokens_per_param: float) -> int:
    """A size ladder's steps: ceil(tokens_per_param * N / batch_tokens), N the point's model's
    parameters (lmpipe.registry, without torch)."""
    model = lmconfig.model_config(config["models"][run["model"]], "model")
    tokens = tokens_per_param * ARCHITECTURES[model.arch].num_params(model)
    return max(1, math.ceil(tokens / run["train"]["batch_tokens"]))


def expand_sweep(config: dict[str, Any], name: str) -> list[str]:
    """Sweep `name`'s points added to `runs:` (a point's earlier expansion replaced), and its
    report to `reports:`; returns the points' names."""
    sweep, where = config["sweeps"][name], f"sweeps.{name}"
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}: a sweep's name is a folder: letters, digits and . _ - only")
    if name in config["runs"]:
        raise ConfigError(f"{where}: {name!r} is also a run (its points would nest in its folder)")
    base = sweep["base"]
    if base not in config["runs"]:
        raise ConfigError(f"{where}.base: unknown run {base!r}{did_you_mean(base, config['runs'])}")
    if ("grid" in sweep) == ("points" in sweep):
        raise ConfigError(f"{where}: give exactly one of `grid` or `points`")
    ladder = sweep.get("tokens_per_param")
    if ladder is not None and lmconfig.is_fine_tuning(config, base):
        raise ConfigError(f"{where}.tokens_per_param: a fine-tuning run's steps follow its epochs")
    points = points_of(sweep)
    keys = list(dict.fromkeys(k for p in points for k in p))
    if ladder is not None and "train.max_steps" in keys:
        raise ConfigError(f"{where}: train.max_steps is set by tokens_per_param; do not sweep it")
    short = short_keys(keys)
    names = []
    for i, point in enumerate(points):
        at = f"{where}.grid" if "grid" in sweep else f"{where}.points[{i}]"
        run = copy.deepcopy(config["runs"][base])
        tokenizer = {
            k.removeprefix(TOKENIZER): v for k, v in point.items() if k.startswith(TOKENIZER)
        }
        for key, value in point.items():
            if not key.startswith(TOKENIZER):
                set_key(config, run, key, value, at, base)
        if tokenizer:
            tokenizer_point(config, run, tokenizer, at, base)
        if ladder is not None:
            run["train"]["max_steps"] = ladder_steps(config, run, ladder)
        wandb = run.get("logging", {}).get("wandb")
        if wandb is not None and wandb.get("group") is None:
            wandb["group"] = name  # a sweep is a W&B group: its points side by side
        run_name = point_name(name, point, short)
        if run_name in names:
            raise ConfigError(f"{at}: two points are both named {run_name!r}")
        names.append(run_name)
        config["runs"][run_name] = run
    config["reports"][report_name(name)] = {
        "runs": names,
        "gpu_hour_price": sweep["gpu_hour_price"],
    }
    return names


def expand(config: dict[str, Any]) -> list[str]:
    """Every sweep's points added to `runs:` (see expand_sweep); their names."""
    return [p for name in config.get("sweeps", {}) for p in expand_sweep(config, name)]


# ----------------------------------------------------------------------------------------------
# the sweep report's params


def _get(d: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        d = d[part]
    return d


def point_value(config: dict[str, Any], run: str, key: str) -> Any:
    """A point's value of a swept key: a run setting, or its model's tokenizer's setting."""
    if key.startswith(TOKENIZER):
        tok = config["models"][config["runs"][run]["model"]]["tokenizer"]
        return config["tokenizers"][tok][key.removeprefix(TOKENIZER)]
    return _get(config["runs"][run], key)


def compute(config: dict[str, Any], run: str) -> float:
    """A run's training FLOPs: llm.c's 6N + 6LCT a token (the architecture's count,
    lmpipe.registry) times its tokens."""
    rc = lmconfig.run_config(config, run)
    t, arch = rc.train, ARCHITECTURES[rc.model.arch]
    return arch.flops_per_token(rc.model, t.seq_len) * t.max_steps * t.batch_tokens


def params(config: dict[str, Any], run: str) -> int:
    """A run's model's parameters, all of them, the token embedding included (Chinchilla's count;
    Kaplan et al.'s leaves the embeddings out): lmpipe.registry, without torch. A size ladder's
    tokens and its report's N are this count."""
    model = lmconfig.run_config(config, run).model
    return ARCHITECTURES[model.arch].num_params(model)


def embedding(config: dict[str, Any], run: str) -> int:
    """A run's model's token embedding, padded vocab x width: the report says how much of N it
    is (most of a tiny model's)."""
    model = lmconfig.run_config(config, run).model
    return model.padded_vocab_size * model.n_embd


def sweep_params(config: dict[str, Any], name: str) -> dict[str, Any]:
    """What the sweep report needs besides the runs: each point's swept values and, for a size
    ladder, each point's parameters (and its token embedding's) and compute, and the presets'
    compute."""
    sweep = config["sweeps"][name]
    runs = config["reports"][report_name(name)]["runs"]
    keys = list(dict.fromkeys(k for p in points_of(sweep) for k in p))
    out: dict[str, Any] = {
        "name": name,
        "base": sweep["base"],
        "keys": keys,
        "short": short_keys(keys),
        "points": {r: {k: point_value(config, r, k) for k in keys} for r in runs},
        "ladder": None,
    }
    if sweep.get("tokens_per_param") is not None:
        out["ladder"] = {
            "tokens_per_param": sweep["tokens_per_param"],
            "params": {r: params(config, r) for r in runs},
            "embedding": {r: embedding(config, r) for r in runs},
            "compute": {r: compute(config, r) for r in runs},
            "presets": [
                {"run": p, "compute": compute(config, p), "reference": ref}
                for p, ref in PRESETS.items()
                if p in config["runs"]
            ],
        }
    return out


def report_params(config: dict[str, Any], report: str) -> str:
    """The report rule's params: lmpipe.config.report_params, and for a sweep's report its
    `sweep` section (sweep_params)."""
    params = json.loads(lmconfig.report_params(config, report))
    sweep = sweep_of_report(config, report)
    if sweep is not None:
        params["sweep"] = sweep_params(config, sweep)
    return lmconfig.canonical_json(params)
