"""envs/*.yaml (conda, one a stage) pin the same versions as pyproject.toml."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from conftest import REPO

ENVS = sorted((REPO / "envs").glob("*.yaml"))


def pins(requirements: list[str]) -> dict[str, str]:
    out = {}
    for req in requirements:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", req.strip())
        assert m, f"not pinned with ==: {req!r}"
        out[m.group(1).lower().replace("-", "_")] = m.group(2)
    return out


PROJECT = pins(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])


def test_every_stage_has_an_env_and_rules_name_existing_envs():
    assert {p.stem for p in ENVS} >= {"data", "train", "convert", "evaluate", "report"}
    rules = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    named = set(re.findall(r'conda:\s*\n\s*"\.\./\.\./envs/([\w-]+)\.yaml"', rules))
    assert named and named <= {p.stem for p in ENVS}


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_env_pins_equal_pyproject(env):
    spec = yaml.safe_load(env.read_text())
    pip_lists = [d["pip"] for d in spec["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert pip_lists, f"{env.name}: no pip section"
    for name, version in pins(pip_lists[0]).items():
        assert name in PROJECT, f"{env.name}: {name} is not a dependency in pyproject.toml"
        assert version == PROJECT[name], (
            f"{env.name}: {name}=={version}, pyproject has {PROJECT[name]}"
        )
