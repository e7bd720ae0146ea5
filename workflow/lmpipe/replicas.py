"""Seeds as replicas: one recipe trained once a seed, so that a comparison can tell a recipe
from its seed.

A run that names `seeds: [1337, 1338, 1339]` is replaced by one run a seed, `<run>/seed=1337`,
..., each with its own `train.seed` (its initial weights and data order): each is cached,
scheduled and submitted like any run, so adding a seed trains only that seed. A report that lists
the run lists its replicas, and treats them as one recipe (lmpipe.report.findings,
lmpipe.report.comparison): the mean and spread of each figure over the seeds, and comparisons
whose intervals hold the seed-to-seed variance.

Torch-free: lmpipe.schema expands the replicas before it validates the config (the replicas are
validated as runs), before the sweeps and before any rule reads `runs:`.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from lmpipe.config import ConfigError

REPLICA = re.compile(r"(?P<recipe>.+)/seed=(?P<seed>\d+)")


def recipe_of(run: str) -> str:
    """The recipe a run is a replica of (`a/seed=1338` -> `a`); any other run is its own."""
    match = REPLICA.fullmatch(run)
    return match["recipe"] if match else run


def seed_of(run: str) -> int | None:
    match = REPLICA.fullmatch(run)
    return int(match["seed"]) if match else None


def expand(config: dict[str, Any]) -> list[str]:
    """Each run with `seeds` replaced in `runs:` by its replicas, and in every report that lists
    it; returns the replicas' names."""
    replicated: dict[str, list[str]] = {}
    for name, run in list(config.get("runs", {}).items()):
        seeds = run.get("seeds")
        if seeds is None:
            continue
        where = f"runs.{name}.seeds"
        if (
            not isinstance(seeds, list)
            or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        ):
            raise ConfigError(f"{where}: a list of seeds (integers from 0), got {seeds!r}")
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        if twice:
            raise ConfigError(f"{where}: seed {twice[0]} is listed twice; each seed is one run")
        if not isinstance(run.get("train"), dict):
            raise ConfigError(f"{where}: a reference run is never trained, so it has no seeds")
        if "seed" in run["train"]:
            raise ConfigError(f"{where}: give train.seed or seeds, not both")
        del config["runs"][name]
        replicated[name] = []
        for seed in seeds:
            replica = copy.deepcopy(run)
            del replica["seeds"]
            replica["train"]["seed"] = seed
            replica_name = f"{name}/seed={seed}"
            config["runs"][replica_name] = replica
            replicated[name].append(replica_name)
    for report in config.get("reports", {}).values():
        report["runs"] = [r for name in report["runs"] for r in replicated.get(name, [name])]
    for name, sweep in config.get("sweeps", {}).items():
        if sweep.get("base") in replicated:
            raise ConfigError(
                f"sweeps.{name}.base: {sweep['base']} has seeds; a sweep's base is one run"
                " (sweep train.seed to replicate its points)"
            )
    for name, run in config.get("runs", {}).items():
        base = (run.get("base") or {}).get("run")
        if base in replicated:
            raise ConfigError(
                f"runs.{name}.base.run: {base} has seeds; name one of its replicas"
                f" ({replicated[base][0]})"
            )
    return [r for names in replicated.values() for r in names]
