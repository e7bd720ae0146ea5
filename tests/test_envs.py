"""envs/*.yaml (conda, one a stage) pin the same versions as pyproject.toml and hold what the
modules of their rules import."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

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


def module_imports(module: str) -> set[str]:
    """Top-level packages `lmpipe.<module>` imports when it loads, following lmpipe's own modules
    and those it starts (`"-m", "lmpipe.train"`: the launcher's torchrun workers). Imports inside
    functions load only when called, so they are not counted."""
    seen, outside, todo = set(), set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = REPO / "workflow" / Path(*name.split("."))
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        todo += re.findall(r'"-m", "(lmpipe\.\w+)"', source.read_text())
        for node in ast.parse(source.read_text()).body:
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found = [node.module]
                if node.module == "lmpipe":
                    found = [f"lmpipe.{alias.name}" for alias in node.names]
            else:
                continue
            for name_ in found:
                if name_.startswith("lmpipe."):
                    todo.append(name_)
                elif name_ != "lmpipe" and name_.split(".")[0] not in sys.stdlib_module_names:
                    outside.add(name_.split(".")[0])
    return outside - {"__future__"}


def rule_modules() -> list[tuple[str, str, str]]:
    """(rule, env, module) for each rule that runs `python -m lmpipe.<module>` in a conda env."""
    found = []
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"\n(?=rule |localrule |checkpoint )", smk.read_text()):
            env = re.search(r'conda:\s*\n\s*"\.\./\.\./envs/([\w-]+)\.yaml"', block)
            module = re.search(r"python -m (lmpipe\.\w+)", block)
            if env and module:
                found.append((block.split(":")[0].split()[-1], env.group(1), module.group(1)))
    return found


@pytest.mark.parametrize("rule,env,module", rule_modules(), ids=lambda v: str(v))
def test_a_rule_env_has_what_its_module_imports(rule, env, module):
    """A `--use-conda` job gets only its env's packages: its module must load with them."""
    spec = yaml.safe_load((REPO / "envs" / f"{env}.yaml").read_text())
    pip_list = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict) and "pip" in d)
    installed = set(pins(pip_list))
    distributions = packages_distributions()
    for package in sorted(module_imports(module)):
        names = {d.lower().replace("-", "_") for d in distributions.get(package, [package])}
        assert names & installed, f"rule {rule}: {module} imports {package}, not in envs/{env}.yaml"
