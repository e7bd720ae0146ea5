"""A Hugging Face model's shape without torch (`arch: hf`): its settings (HFSettings, what a
`models:` entry of this arch sets: the folder, not the shape) and its counts, which are measured,
not a formula: lmpipe.hf_config builds the model from its config.json on PyTorch's meta device,
in a subprocess, and keeps the measure, so the plan's process stays torch-free.

The registry's hf entry points here (lmpipe.registry.ARCHITECTURES). Importing only lmpipe's
ground: the plan's process imports it (tests/test_layout.py holds both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmpipe.hf_config import HFShape, read_shape
from lmpipe.settings import optional, required, setting


@dataclass(frozen=True, kw_only=True)
class HFSettings:
    """model.arch hf: a Hugging Face decoder-only causal LM, by a local folder or a hub id. Its
    shape is its config.json's (lmpipe.hf_config): a `models:` entry of this arch sets none."""

    path: str = required("a local model folder, or a hub id (fetched by the download stage)")
    revision: str | None = optional("the hub revision (a commit sha pins it); null: main")
    trust_remote_code: bool = setting(
        False, "run the model repo's own Python code (the report says so when on)"
    )


def shape(m: Any) -> HFShape:
    """The model's measured shape (lmpipe.hf_config.read_shape: cached after the first)."""
    return read_shape(m.path, m.trust_remote_code)


def num_params(m: Any) -> int:
    """Every parameter once (a tied head is the token embedding)."""
    return shape(m).num_params


def flops_params(m: Any) -> int:
    """The N of llm.c's 6N + 6LCT: the parameters a token's matmuls use (the token embedding a
    lookup unless tied; of a mixture of experts, the experts a token goes to)."""
    return shape(m).flops_params


def attention_flops(m: Any, seq_len: int) -> int:
    """The 6LCT of llm.c's 6N + 6LCT, each layer over its own window."""
    return shape(m).attention_flops(seq_len)
