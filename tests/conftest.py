"""Shared fixtures: paths to the repo and to the real data beside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
RESOURCES = REPO / "resources"
TOKENIZER_DIR = RESOURCES / "gpt2"

# Multi-rank tests share 2 cores: one thread a rank avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def fineweb_texts() -> list[str]:
    """Real FineWeb documents from the embedded sample."""
    import pyarrow.parquet as pq

    return pq.read_table(RESOURCES / "fineweb_sample.parquet", columns=["text"])["text"].to_pylist()
