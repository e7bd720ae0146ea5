"""Compare two results folders figure by figure: did a change leave the pipeline's numbers alone?

    python tools/compare_results.py results_before results_after [--tolerance 0]

For a refactor that must not change behaviour: run the same config before and after (e.g. `make
demo` in two clones) and compare. It checks
- shards: every dataset's token shards and prepared conversations (sha256 from the manifests);
- training: every run's train loss, lr and grad norm at each step, and its val losses;
- evaluations: every number of every eval/*.json (value, acc, acc_norm, items, tokens, ...);
- samples: each completion (a completion cut shorter is reported as a prefix, not a change).
It prints one line a difference (a field only after is a note, not a difference), and a
summary; the exit code is 1 if any figure differs by more than --tolerance (absolute) or is
missing after. Timings, paths and provenance are not compared.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

TRAIN_KEYS = ("loss", "lr", "grad_norm")
NOT_FIGURES = ("produced_by", "wall_s", "tokens_per_s", "mfu")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def metrics(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """(kind, step) -> line of a metrics.jsonl; a later line of a step wins (resumed runs)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            kind = "val" if "val_loss" in row else "train" if "loss" in row else "other"
            out[(kind, row["step"])] = row
    return out


class Comparison:
    def __init__(self, tolerance: float):
        self.tolerance = tolerance
        self.compared = 0
        self.differences: list[str] = []
        self.notes: list[str] = []

    def number(self, where: str, a: Any, b: Any) -> None:
        self.compared += 1
        if isinstance(a, int | float) and isinstance(b, int | float):
            same = a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= self.tolerance
        else:
            same = a == b
        if not same:
            self.differences.append(f"{where}: {a!r} -> {b!r}")

    def figures(self, where: str, a: Any, b: Any) -> None:
        """Every number of two JSON values, recursively (samples compared as text)."""
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if key in NOT_FIGURES:
                    continue
                if key not in a:  # a new field: fine for a refactor, said all the same
                    self.notes.append(f"{where}.{key}: new after")
                    continue
                if key not in b:
                    self.differences.append(f"{where}.{key}: missing after")
                    continue
                self.figures(f"{where}.{key}", a[key], b[key])
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                self.figures(f"{where}[{i}]", x, y)
        elif isinstance(a, str) and isinstance(b, str) and a != b and a.startswith(b):
            self.compared += 1
            self.notes.append(f"{where}: after is a prefix of before ({len(b)} of {len(a)} chars)")
        else:
            self.number(where, a, b)


def compare(before: Path, after: Path, tolerance: float) -> Comparison:
    c = Comparison(tolerance)
    for manifest in sorted((before / "data").glob("*/*/manifest.json")):
        rel = manifest.relative_to(before)
        other = after / rel
        if not other.exists():
            c.differences.append(f"{rel}: missing after")
            continue
        a = {s["file"]: s.get("sha256") for s in read_json(manifest).get("shards", [])}
        b = {s["file"]: s.get("sha256") for s in read_json(other).get("shards", [])}
        c.figures(str(rel.parent), a, b)
    for run_dir in sorted((before / "runs").glob("*")):
        run = run_dir.name
        if not (after / "runs" / run).exists():
            c.differences.append(f"runs/{run}: missing after")
            continue
        a = metrics(run_dir / "train" / "metrics.jsonl")
        b = metrics(after / "runs" / run / "train" / "metrics.jsonl")
        for key in sorted(set(a) | set(b)):
            where = f"{run} {key[0]} step {key[1]}"
            if key not in a or key not in b:
                c.differences.append(f"{where}: only in {'after' if key in b else 'before'}")
                continue
            keys = TRAIN_KEYS if key[0] == "train" else ("val_loss",)
            for k in keys:
                if k in a[key] or k in b[key]:
                    c.number(f"{where} {k}", a[key].get(k), b[key].get(k))
        for result in sorted((run_dir / "eval").glob("*.json")):
            other = after / "runs" / run / "eval" / result.name
            if not other.exists():
                c.differences.append(f"{run} eval/{result.name}: missing after")
                continue
            c.figures(f"{run} eval/{result.stem}", read_json(result), read_json(other))
    return c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("before", type=Path, help="a results folder (the config's paths.results)")
    p.add_argument("after", type=Path)
    p.add_argument("--tolerance", type=float, default=0.0, help="absolute, for each figure")
    args = p.parse_args(argv)
    c = compare(args.before, args.after, args.tolerance)
    for line in c.notes:
        print(f"note: {line}")
    for line in c.differences:
        print(f"DIFFERS {line}")
    print(
        f"{c.compared} figures compared, {len(c.differences)} differ"
        f" (tolerance {args.tolerance:g}), {len(c.notes)} notes"
    )
    return 1 if c.differences else 0


if __name__ == "__main__":
    sys.exit(main())
