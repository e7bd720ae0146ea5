"""The package's layout: one subpackage a stage, imports only downward (DESIGN's layers)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "workflow" / "lmpipe"
# the ground: every stage may use these, and they use nothing above them
GROUND = {
    "config",
    "hf_config",
    "paths",
    "provenance",
    "files",
    "registry",
    "schema",
    "hardware",
    "plan",
    "throughputs",
    "sweeps",
    "bases",
    "dag",
    "costs",
    "resources",
    "settings",
    "config_schema",
    "failures",
    "stale",
    "hf_folder",
    "cluster",
    "pending",
    "job_params",
    "import_noise",
    "replicas",
    "stats",
    "manifests",
    "llmc_shards",
}
# definition modules: tables of plain data and functions, torch-free and importing no lmpipe
# module, which any layer may read (the ground included: the suite's tasks are defined once, and
# the config check, the plan and the report read them)
DEFINITIONS = {"eval.suite.tasks", "data.chat_format"}
# each architecture's shape (lmpipe/models/<arch>/shape.py): its settings and its parameter and
# FLOPs counts, torch-free and importing only the ground, which the registry's entry points to
# (torchtitan's ModelSpec: a model's parts in its package); the ground may import them, and so
# the packages on their way import nothing heavy (test_the_snakefile_s_imports_pull_in_no_torch)
SHAPES = {f"models.{p.parent.name}.shape" for p in PACKAGE.glob("models/*/shape.py")}
# what each stage may import besides the ground: the stages whose work it consumes
MAY_IMPORT = {
    "data": {"data"},
    "models": {"data", "models"},
    "train": {"data", "models", "eval", "train"},  # its evaluations during training
    "eval": {"data", "models", "eval"},
    "chat": {"data", "models", "train", "eval", "chat"},
    "report": {"report"},
}


def lmpipe_imports(path: Path) -> set[str]:
    """The first part after `lmpipe.` of every lmpipe import in a file (functions included),
    a definition module's and a shape module's import left out."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        names = [n for n in names if not any(_within(n, d) for d in DEFINITIONS | SHAPES)]
        found |= {n.split(".")[1] for n in names if n.startswith("lmpipe.")}
    return found


def _within(name: str, definition: str) -> bool:
    """`lmpipe.<definition>` itself, a name in it, or a package on its way (`from lmpipe.eval.suite
    import tasks` names lmpipe.eval.suite and lmpipe.eval.suite.tasks)."""
    full = f"lmpipe.{definition}"
    return name == full or name.startswith(full + ".") or full.startswith(name + ".")


def test_one_subpackage_a_stage_and_the_ground():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert subpackages == set(MAY_IMPORT)
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == GROUND
    for stage in MAY_IMPORT:  # each stage runs as `python -m lmpipe.<stage>`
        assert (PACKAGE / stage / "__main__.py").is_file(), stage


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_imports_only_go_down(path: Path):
    parts = path.relative_to(PACKAGE).parts
    allowed = GROUND | (MAY_IMPORT[parts[0]] if len(parts) > 1 else set())
    if module_of(path).removeprefix("lmpipe.") in SHAPES:
        allowed = GROUND  # the ground reads it
    wrong = lmpipe_imports(path) - allowed
    assert not wrong, (
        f"lmpipe/{'/'.join(parts)} imports lmpipe.{wrong} (allowed: {sorted(allowed)})"
    )


@pytest.mark.parametrize("module", sorted(DEFINITIONS))
def test_a_definition_module_imports_no_lmpipe_module(module: str):
    path = PACKAGE.joinpath(*module.split(".")).with_suffix(".py")
    assert not lmpipe_imports_of(path), f"lmpipe.{module} imports {lmpipe_imports_of(path)}"


def lmpipe_imports_of(path: Path) -> list[str]:
    """Every lmpipe module a file names in an import."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append("." * node.level + node.module)
    return [n for n in names if n.startswith(("lmpipe", "."))]


def test_the_snakefile_s_imports_pull_in_no_torch():
    """The ground the Snakefile imports at parse time, the definitions and the architectures'
    shapes it reads included (each shape first: its packages' __init__ run before the ground)."""
    assert {"models.gpt2.shape", "models.modern.shape", "models.hf.shape"} <= SHAPES
    code = (
        "import sys\n"
        + "".join(f"import lmpipe.{shape}\n" for shape in sorted(SHAPES))
        + "import lmpipe.config, lmpipe.plan, lmpipe.costs, lmpipe.resources, lmpipe.registry\n"
        "import lmpipe.schema, lmpipe.sweeps, lmpipe.dag, lmpipe.cluster, lmpipe.pending\n"
        "heavy = sorted(m for m in ('torch', 'lm_eval', 'transformers') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def module_of(path: Path) -> str:
    """`lmpipe.eval.suite.tasks` of workflow/lmpipe/eval/suite/tasks.py (a package: its folder)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each lmpipe module -> the lmpipe modules it imports (inside functions too): the most
    specific module a dotted name names (`from lmpipe.eval import packing`: lmpipe.eval.packing)."""
    modules = {module_of(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            else:
                continue
            for n in names:
                while n and n not in modules:
                    n = n.rpartition(".")[0]
                if n.startswith("lmpipe.") and n != name:
                    edges.add(n)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph (a -> b -> ... -> a), or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_circle_finder_finds_a_planted_circle():
    graph = import_graph()
    graph["lmpipe.plan"] = graph["lmpipe.plan"] | {"lmpipe.schema"}
    graph["lmpipe.schema"] = graph["lmpipe.schema"] | {"lmpipe.sweeps"}
    graph["lmpipe.sweeps"] = graph["lmpipe.sweeps"] | {"lmpipe.plan"}
    assert find_cycle(graph) is not None


MAX_FUNCTION_LINES = 60  # a function a newcomer reads on one screen


def test_every_function_fits_on_a_screen():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fl", REPO / "tools" / "function_lengths.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    found = tool.function_lengths(PACKAGE)
    long = [f"{where} ({n} lines)" for n, where in found if n > MAX_FUNCTION_LINES]
    assert not long, f"over {MAX_FUNCTION_LINES} lines: " + "; ".join(long)
