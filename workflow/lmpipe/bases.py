"""A Hugging Face base measured beside what was trained from it.

A run of an `arch: hf` model (a fine-tuning of `base: {hf: DIR}`, or continued pretraining) starts
from weights nobody measured in this pipeline. Its report should say what the training changed,
so each such model is also measured as it is: a reference run (`train: null`) of the same model
on the same text dataset, with the trained run's evaluation settings (the same val text, tasks,
prompts and, for a fine-tuning, the same held-out conversations: lmpipe.config.chat_dataset).
It is named `<model>-base` (`<model>-base-<dataset>` where one model is trained on several text
datasets), unless the config already has a reference run of that model on that dataset, which
serves instead. Every report that lists the trained run lists its base just before it.

Torch-free: lmpipe.schema adds these runs after the sweeps and validates them as runs, before any
rule reads `runs:`.
"""

from __future__ import annotations

import copy
from typing import Any

from lmpipe import config as lmconfig


def trained_from_hf(config: dict[str, Any]) -> list[str]:
    """The runs that train an `arch: hf` model (fine-tuning or continued pretraining)."""
    return [
        name
        for name, r in config["runs"].items()
        if r["train"] is not None and config["models"][r["model"]].get("arch") == "hf"
    ]


def base_run_name(config: dict[str, Any], model: str, dataset: str) -> str:
    """The reference run measuring `model` on text `dataset`: one the config has, else the name
    this module gives it."""
    for name, r in config["runs"].items():
        if r["train"] is None and r["model"] == model and r["dataset"] == dataset:
            return name
    datasets = {lmconfig.text_dataset(config, r) for r in trained_from_hf(config)
                if config["runs"][r]["model"] == model}  # fmt: skip
    return f"{model}-base" if len(datasets) <= 1 else f"{model}-base-{dataset}"


def expand(config: dict[str, Any]) -> list[str]:
    """Add each `arch: hf` trained run's base as a reference run, and list it before the trained
    run in every report that lists that; returns the runs added."""
    added: list[str] = []
    base_of: dict[str, str] = {}
    for run in trained_from_hf(config):
        r = config["runs"][run]
        dataset = lmconfig.text_dataset(config, run)
        name = base_run_name(config, r["model"], dataset)
        base_of[run] = name
        if name in config["runs"]:
            continue
        config["runs"][name] = {
            "dataset": dataset,
            "model": r["model"],
            "train": None,
            "launch": copy.deepcopy(r["launch"]),
            "eval": copy.deepcopy(r["eval"]),
        }
        added.append(name)
    for report in config.get("reports", {}).values():
        runs: list[str] = []
        for run in report["runs"]:
            base = base_of.get(run)
            if base is not None and base not in runs and base not in report["runs"]:
                runs.append(base)
            runs.append(run)
        report["runs"] = runs
    return added
