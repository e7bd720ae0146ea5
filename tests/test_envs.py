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
from lmpipe.registry import ARCHITECTURES, EVALUATIONS, OPTIMIZERS

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


LMPIPE_MODULE = r'"(lmpipe(?:\.\w+)+)(?::\w+)?"'  # "lmpipe.x.y" or "lmpipe.x.y:function"


def lazy_exports(package: str) -> dict[str, str]:
    """A package's names that load on first use (its `EXPORTS`, lmpipe.models.lazy_exports),
    each with the module it comes from; {} for a module or a package without them."""
    init = REPO / "workflow" / Path(*package.split(".")) / "__init__.py"
    if not init.is_file():
        return {}
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "EXPORTS":
            exports = ast.literal_eval(node.value)  # {"name": "module:attribute"}
            return {name: ref.split(":")[0] for name, ref in exports.items()}
    return {}


# modules that import lmpipe.registry entries' code by name, and the modules of those entries
# (an architecture's package, and what it exports: the job asks for Model, load_hf, ...)
DISPATCH = {
    "lmpipe.models.build": [
        module
        for a in ARCHITECTURES.values()
        for module in [a.module, *lazy_exports(a.module).values()]
    ],
    "lmpipe.train.optim": [o.build.split(":")[0] for o in OPTIMIZERS.values()],
    "lmpipe.eval.__main__": [e.run.split(":")[0] for e in EVALUATIONS.values()],
}


# packages a rule's modules import only when a setting asks for them, each with the one module
# allowed to import it, inside a function: the env leaves them out (the user installs the extra)
OPTIONAL = {
    "wandb": "lmpipe.train.wandb_log",  # logging.wandb: the [wandb] extra
    # train.loss_kernel's fused Triton kernels (CUDA only): installed by hand where wanted
    "liger_kernel": "lmpipe.models.head_loss",
    "cut_cross_entropy": "lmpipe.models.head_loss",
}


# functions whose imports (and modules they start) no job's env needs: they run in the process
# that checks the config (Snakemake's own), whose result its jobs read from a cache
# (LMPIPE_HF_SHAPES)
PARSE_TIME_ONLY = {("hf_config.py", "measure"), ("hf_config.py", "check_tokenizer")}


def module_imports(*modules: str) -> set[str]:
    """Top-level packages that `modules` import, anywhere in their code (inside functions too:
    a job calls them), following lmpipe's own modules, a package's __init__ and __main__, and
    the modules they name as strings (those the launcher starts under torchrun) and the registry
    entries a module dispatches to (DISPATCH)."""
    seen, outside, todo = set(), set(), list(modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        package, _, attribute = name.rpartition(".")
        if attribute in lazy_exports(package):  # `from package import name`: loads its module
            todo.append(lazy_exports(package)[attribute])
        path = REPO / "workflow" / Path(*name.split("."))
        sources = [path / "__init__.py"] if path.is_dir() else [path.with_suffix(".py")]
        if path.is_dir() and name in modules:  # `python -m package` runs its __main__
            todo.append(f"{name}.__main__")
        todo += DISPATCH.get(name, [])
        for parent in range(
            1, name.count(".") + 1
        ):  # importing a.b.c runs a/__init__, a/b/__init__
            todo.append(".".join(name.split(".")[:parent]))
        for source in (s for s in sources if s.is_file()):
            todo += import_names(source, outside)
    return outside - {"__future__"}


def import_names(source: Path, outside: set[str]) -> list[str]:
    """lmpipe modules `source` imports or names; adds outside top-level packages to `outside`."""
    text = source.read_text()
    # named modules (a torchrun worker); the registry's are followed where they run (DISPATCH),
    # a package's lazy exports where a module imports one of their names (module_imports)
    found_lmpipe = [] if source.name == "registry.py" else re.findall(LMPIPE_MODULE, text)
    if source.name == "__init__.py":
        package = ".".join(source.parent.relative_to(REPO / "workflow").parts)
        lazy = set(lazy_exports(package).values())
        found_lmpipe = [m for m in found_lmpipe if m not in lazy]
    tree = ast.parse(text)
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and (source.name, node.name) in PARSE_TIME_ONLY
        for inner in ast.walk(node)
    }
    started = {  # the modules those functions start (`python -m ...`)
        node.value
        for node in ast.walk(tree)
        if id(node) in skipped and isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    found_lmpipe = [m for m in found_lmpipe if m not in started]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from lmpipe.data import shards`: shards may be a module of its own
            found = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in found:
            if name == "lmpipe" or name.startswith("lmpipe."):
                found_lmpipe.append(name)
            elif name.split(".")[0] not in sys.stdlib_module_names:
                outside.add(name.split(".")[0])
    return found_lmpipe


def rule_modules() -> list[tuple[str, str, tuple[str, ...]]]:
    """(rule, env, modules) for each rule that runs `python -m lmpipe.<module>` in a conda env;
    the modules it names in its block too (the train rule's two torchrun workers)."""
    found = []
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"\n(?=rule |localrule |checkpoint )", smk.read_text()):
            env = re.search(r'conda:\s*\n\s*"\.\./\.\./envs/([\w-]+)\.yaml"', block)
            module = re.search(r"python -m (lmpipe[\w.]*)", block)
            if env and module:
                named = tuple(dict.fromkeys([module.group(1), *re.findall(LMPIPE_MODULE, block)]))
                found.append((block.split(":")[0].split()[-1], env.group(1), named))
    return found


def test_the_train_rule_follows_both_workers():
    [(_, _, modules)] = [r for r in rule_modules() if r[0] == "train"]
    assert {"lmpipe.train", "lmpipe.train.pretrain", "lmpipe.chat.finetune"} <= set(modules)


@pytest.mark.parametrize("rule,env,modules", rule_modules(), ids=lambda v: str(v))
def test_a_rule_env_has_what_its_module_imports(rule, env, modules):
    """A `--use-conda` job gets only its env's packages: its module must load with them."""
    spec = yaml.safe_load((REPO / "envs" / f"{env}.yaml").read_text())
    pip_list = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict) and "pip" in d)
    installed = set(pins(pip_list))
    distributions = packages_distributions()
    for package in sorted(module_imports(*modules) - set(OPTIONAL)):
        names = {d.lower().replace("-", "_") for d in distributions.get(package, [package])}
        assert names & installed, f"rule {rule}: {modules} import {package}, not in envs/{env}.yaml"


def top_level_imports(source: Path) -> set[str]:
    """Top-level packages `source` imports when it is imported (not inside a function)."""
    found = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package,owner", OPTIONAL.items())
def test_an_optional_package_is_imported_lazily_by_its_module_only(package, owner):
    """Left out of the env, an optional package must never load with a job that does not ask
    for it: only its module imports it, and only inside a function."""
    modules = REPO / "workflow" / "lmpipe"
    importers = set()
    for source in modules.rglob("*.py"):
        outside: set[str] = set()
        import_names(source, outside)
        if package in outside:
            importers.add(".".join(source.relative_to(modules.parent).with_suffix("").parts))
        assert package not in top_level_imports(source), f"{source} imports {package} at the top"
    assert importers == {owner}
    assert not set(OPTIONAL) & set(PROJECT), "an optional package is a dependency after all"
