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
