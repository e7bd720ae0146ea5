"""The throughputs every estimate rests on (resources/throughputs.yaml), each marked measured or
assumed. Torch- and jsonschema-free, so the plan and the train job's launcher read the same
figures.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import yaml

from lmpipe.paths import REPO_ROOT

THROUGHPUTS = REPO_ROOT / "resources" / "throughputs.yaml"


@cache
def throughputs() -> dict[str, Any]:
    return yaml.safe_load(THROUGHPUTS.read_text())


def figure(section: str, key: str) -> float:
    return float(throughputs()[section][key]["value"])


def basis(section: str, key: str) -> str:
    entry = throughputs()[section][key]
    return "measured" if "measured" in entry else "assumed"


def stated(section: str, key: str, fmt: str = "{:.3g}", scale: float = 1.0) -> str:
    """A figure as the plan prints it (times `scale`, in `fmt`), with how it is known: e.g.
    "3.31e+06/s measured", so a reader of an estimate sees which figures are only assumed."""
    return f"{fmt.format(figure(section, key) * scale)} {basis(section, key)}"
