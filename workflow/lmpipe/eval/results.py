"""Result files: every evaluation writes one small JSON file, atomically, with what produced it.

A result: {"metric", "value", "tokens" or "items", ..., "produced_by": {"module", "model",
"scoring", "checkpoint" (the run's meta.json: step, tokens, settings hash), code and package
versions, ...}}. The report reads these.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lmpipe import provenance
from lmpipe.files import write_text_atomic
from lmpipe.models import read_hf_meta


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def mean_stderr(values: Sequence[float]) -> float | None:
    """Standard error of a mean as lm-eval reports it beside an accuracy (its `mean_stderr`):
    the sample standard deviation (n - 1) over sqrt(n); None for fewer than two values (where
    lm-eval's formula divides by zero)."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def produced_by(module: str, model: str | Path, scoring: str, **extra: Any) -> dict[str, Any]:
    return {
        "module": module,
        "model": str(model),
        "scoring": scoring,
        "checkpoint": read_hf_meta(model) if Path(model).is_dir() else None,
        **extra,
        **provenance.collect(),
    }


def write_result(path: str | Path, result: dict[str, Any]) -> None:
    """Write atomically (tmp, then rename): a result file is either whole or absent."""
    write_text_atomic(path, json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}: {result['metric']} = {result.get('value')}")
