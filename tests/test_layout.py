"""The package's layout: one subpackage a stage, imports only downward (DESIGN's layers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "workflow" / "lmpipe"
# the ground: every stage may use these, and they use nothing above them
GROUND = {
    "config",
    "paths",
    "provenance",
    "files",
    "registry",
    "schema",
    "hardware",
    "plan",
    "throughputs",
    "sweeps",
    "dag",
    "settings",
    "config_schema",
}
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
    """The first part after `lmpipe.` of every lmpipe import in a file (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n.split(".")[1] for n in names if n.startswith("lmpipe.")}
    return found


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
    wrong = lmpipe_imports(path) - allowed
    assert not wrong, (
        f"lmpipe/{'/'.join(parts)} imports lmpipe.{wrong} (allowed: {sorted(allowed)})"
    )
