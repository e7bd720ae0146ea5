"""How much text a token holds: the bytes a token of the val text, for each tokenizer in a report.

A tokenizer with more bytes a token spends fewer tokens (and steps, and positions of the context)
on the same text; its val loss in nats a token is then higher for as good a model, which is why
runs of different tokenizers compare by bits per byte. The figure here is read from the tokens
manifest's val shards and its byte table (lmpipe.data.token_bytes): the UTF-8 bytes the shards'
tokens spell over those tokens, the end-of-text token that opens each document counted as a
token of 0 bytes (as bits per byte counts it, lmpipe.eval.val_loss). GPT-2's tokens of each
run's text are in the row beside the runs' own, where that data was tokenized.

The evaluation tasks' text (the suite's tasks, HellaSwag) is counted by the task_bytes jobs
(lmpipe.eval.task_bytes, one small JSON a tokenizer and text, GPT-2's and each run's own): the
report reads those files, so it stays torch-free and tokenizes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmpipe import manifests
from lmpipe.llmc_shards import read_shard
from lmpipe.paths import Layout
from lmpipe.report.runs import Run, tokens_name

CHUNK = 1 << 22  # tokens a read: a val shard of 100M tokens is counted in 24 pieces


@dataclass(frozen=True)
class ValCompression:
    """The val shards of one tokens manifest: their tokens and the bytes those tokens spell."""

    tokens: int
    bytes: int
    vocab_size: int  # the byte table's length: every id of the tokenizer, its special ones too

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens


def val_compression(manifest: str | Path) -> ValCompression | None:
    """The val text's bytes a token in a tokens manifest's tokens; None for a mixture's manifest
    or data tokenized before its byte table."""
    if manifests.is_mixture(manifest):
        return None
    m = manifests.read_tokens(manifest)
    table = m.byte_table()
    if table is None:
        return None
    tokens = n_bytes = 0
    for path in m.files("val"):
        shard = read_shard(path)
        for start in range(0, len(shard), CHUNK):
            ids = np.asarray(shard[start : start + CHUNK], dtype=np.int64)
            tokens += len(ids)
            n_bytes += int(table[ids].sum())
    return ValCompression(tokens, n_bytes, len(table))


def compression_rows(runs: list[Run], layout: Layout) -> list[dict[str, Any]]:
    """One row a tokenizer and text of the report's runs (GPT-2's first, where tokenized): its
    vocabulary, the val text's tokens and bytes and the bytes a token, and the runs in it."""
    found: dict[tuple[str, str | None], list[str]] = {}
    for run in runs:
        if "dataset" not in run.settings:
            continue
        dataset = run.settings.get("text_dataset") or run.settings["dataset"]
        found.setdefault((dataset, None), [])
        found.setdefault((dataset, run.settings.get("tokens_of")), []).append(run.name)
    rows = []
    for (dataset, of), names in sorted(found.items(), key=lambda k: (k[0][0], k[0][1] or "")):
        manifest = layout.tokens_manifest(dataset, of)
        if not Path(manifest).exists() or (c := val_compression(manifest)) is None:
            continue
        rows.append(
            {
                "tokenizer": tokens_name(of).removesuffix("'s tokens"),
                "dataset": dataset, "vocab_size": c.vocab_size, "tokens": c.tokens,
                "bytes": c.bytes, "bytes_per_token": c.bytes_per_token, "runs": names,
            }
        )  # fmt: skip
    return rows


def task_compression(runs: list[Run], layout: Layout, val_rows: list[dict]) -> dict[str, Any]:
    """Bytes a token on each evaluation task's text, a row a tokenizer (GPT-2's first), beside
    each val text's (`val_rows`, compression_rows'): {"columns": [...], "rows": [...]}; empty
    where no run of the report is scored on a task."""
    texts = sorted({t for run in runs for t in run.settings.get("task_texts", [])})
    if not texts:
        return {}
    ofs = [None, *sorted({run.settings.get("tokens_of") for run in runs} - {None})]
    datasets = sorted({r["dataset"] for r in val_rows})
    columns = [f"val: {d}" for d in datasets]
    rows = []
    for of in ofs:
        name = tokens_name(of).removesuffix("'s tokens")
        cells = {f"val: {r['dataset']}": r["bytes_per_token"] for r in val_rows
                 if r["tokenizer"] == name}  # fmt: skip
        for text in texts:
            path = Path(layout.task_bytes(text, of))
            if not path.exists():
                continue
            for task, c in json.loads(path.read_text())["tasks"].items():
                cells[task] = c["bytes"] / c["tokens"]
                columns += [task] if task not in columns else []
        rows.append({"tokenizer": name, "cells": cells})
    if len(columns) == len(datasets):
        return {}
    return {"columns": columns, "rows": rows}
