"""The longest functions of a package: lines from `def` to the last line of the body.

    python tools/function_lengths.py workflow/lmpipe            # every function over 60 lines
    python tools/function_lengths.py workflow/lmpipe --over 40  # over another length
    python tools/function_lengths.py workflow/lmpipe --top 20   # the 20 longest, whatever length

A function's length counts its decorators, docstring and nested functions (a closure is part of
the function that holds it); tests/test_layout.py holds every function under the package to 60.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def function_lengths(root: Path) -> list[tuple[int, str]]:
    """(lines, "path:line name") of every function and method under `root`, longest first."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = node.end_lineno - start + 1
                found.append((lines, f"{path.relative_to(root)}:{node.lineno} {node.name}"))
    return sorted(found, key=lambda f: (-f[0], f[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path)
    p.add_argument("--over", type=int, default=60, help="list functions longer than this")
    p.add_argument("--top", type=int, help="list the N longest instead")
    args = p.parse_args()
    found = function_lengths(args.root)
    shown = found[: args.top] if args.top else [f for f in found if f[0] > args.over]
    for lines, where in shown:
        print(f"{lines:5d}  {where}")
    over = sum(1 for n, _ in found if n > args.over)
    print(f"{len(found)} functions; {over} over {args.over} lines")


if __name__ == "__main__":
    main()
