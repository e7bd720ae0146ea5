"""HellaSwag: load the rowanz jsonl, and score it natively, batched, two ways.

`evaluate` (the `hellaswag` evaluation) scores the run's converted model with llm.c's scoring.

Each item is a context and four endings; the model picks the ending it finds most likely.

- `llmc` scoring (llm.c's `dev/data/hellaswag.py`; the figure llm.c quotes, in lmpipe's references):
  tokens of `ctx` then of `" " + ending`, loss over the ending's tokens only;
  acc from the summed loss, acc_norm from the mean loss per ending token.
- `lm_eval` scoring (the lm-eval harness's `hellaswag` task, reproduced to prove the scorer right):
  its preprocessing (`activity_label: ctx_a Ctx_b`, WikiHow `[title]` and bracket artefacts
  removed), the continuation tokenized as lm-eval's `_encode_pair` does (the whole text, minus the
  context's tokens); acc from the summed log-likelihood, acc_norm from the log-likelihood divided
  by the ending's length in characters.

Speed comes from packing the rows as prefix trees (lmpipe.eval.packing: an item's context through
the model once for its four endings, many items a sequence) and from running the LM head only at
the ending's positions, where lm-eval computes a log-softmax over the whole vocabulary at every
position of every row.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken
import torch
from tqdm import tqdm

from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval import packing
from lmpipe.eval.results import mean_stderr, produced_by
from lmpipe.models import load_hf
from lmpipe.paths import TOKENIZER_DIR
from lmpipe.registry import HellaSwagSettings

MODES = ("llmc", "lm_eval")
NUM_ENDINGS = 4
REQUIRED = {"activity_label": str, "ctx_a": str, "ctx_b": str, "ctx": str}


class HellaSwagError(ValueError):
    """A malformed HellaSwag file; the message names the file and line."""


# ----------------------------------------------------------------------------------------------
# loading


def check_item(item: object, where: str) -> dict:
    if not isinstance(item, dict):
        raise HellaSwagError(f"{where}: expected a JSON object, got {type(item).__name__}")
    for key, typ in REQUIRED.items():
        if not isinstance(item.get(key), typ):
            raise HellaSwagError(f"{where}: field {key!r} missing or not a {typ.__name__}")
    endings = item.get("endings")
    if not (
        isinstance(endings, list)
        and len(endings) == NUM_ENDINGS
        and all(isinstance(e, str) for e in endings)
    ):
        raise HellaSwagError(f"{where}: 'endings' must be a list of {NUM_ENDINGS} strings")
    label = item.get("label")
    if isinstance(label, str) and label.isdigit():  # the HF dataset's form
        label = int(label)
    if not (isinstance(label, int) and not isinstance(label, bool) and 0 <= label < NUM_ENDINGS):
        raise HellaSwagError(f"{where}: 'label' must be an integer 0..3, got {item.get('label')!r}")
    return item | {"label": label}


def load_items(path: str | Path, limit: int | None = None) -> list[dict]:
    """Items of a rowanz-format jsonl (e.g. hellaswag_val.jsonl), checked line by line.

    The first `limit` items (all if None). Blank lines are skipped; anything else that is not a
    valid item is an error naming the file and line number.
    """
    path = Path(path)
    if not path.is_file():
        raise HellaSwagError(f"{path}: HellaSwag file not found")
    items = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if limit is not None and len(items) >= limit:
                break
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise HellaSwagError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise HellaSwagError(f"{where}: not valid JSON ({e.msg})") from None
            items.append(check_item(item, where))
    if not items:
        raise HellaSwagError(f"{path}: no items")
    return items


# ----------------------------------------------------------------------------------------------
# turning an item into (context tokens, continuation tokens) rows


def preprocess(text: str) -> str:
    """lm-eval's `tasks/hellaswag/utils.preprocess`."""
    text = text.strip()
    text = text.replace(" [title]", ". ")  # WikiHow artefacts
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def lm_eval_prompt(item: dict) -> tuple[str, list[str]]:
    """lm-eval's `process_docs`: the query and the choices (without the leading space)."""
    ctx = item["ctx_a"] + " " + item["ctx_b"].capitalize()
    return preprocess(item["activity_label"] + ": " + ctx), [preprocess(e) for e in item["endings"]]


def item_rows(item: dict, enc: tiktoken.Encoding, mode: str) -> list[tuple[list[int], list[int]]]:
    """The four (context tokens, ending tokens) rows of an item under a scoring mode."""
    if mode == "llmc":
        ctx = enc.encode_ordinary(item["ctx"])
        return [(ctx, enc.encode_ordinary(" " + e)) for e in item["endings"]]
    if mode == "lm_eval":
        query, choices = lm_eval_prompt(item)
        # lm-eval's _encode_pair: encode context + continuation whole, split at the context's
        # length (continuation = target_delimiter " " + choice; the query has no trailing space).
        ctx = enc.encode_ordinary(query)
        rows = []
        for choice in choices:
            whole = enc.encode_ordinary(query + " " + choice)
            rows.append((whole[: len(ctx)], whole[len(ctx) :]))
        return rows
    raise ValueError(f"unknown scoring mode {mode!r} (expected one of {', '.join(MODES)})")


def normaliser(item: dict, rows: list[tuple[list[int], list[int]]], mode: str) -> np.ndarray:
    """acc_norm's divisor of the log-likelihood: ending tokens (llm.c) or characters (lm-eval)."""
    if mode == "llmc":
        return np.array([len(cont) for _, cont in rows], dtype=np.float64)
    return np.array([len(c) for c in lm_eval_prompt(item)[1]], dtype=np.float64)


# ----------------------------------------------------------------------------------------------
# scoring


@dataclass
class HellaSwagScore:
    mode: str
    items: int
    acc: float
    acc_norm: float
    pred: list[int]  # per item: argmax of the summed log-likelihood
    pred_norm: list[int]  # per item: argmax of the normalised log-likelihood
    loglik: list[list[float]]  # per item, per ending: summed log-likelihood


def score(
    model: torch.nn.Module,
    items: list[dict],
    enc: tiktoken.Encoding,
    mode: str = "llmc",
    batch_items: int = 16,
    device: str | torch.device = "cpu",
    show_progress: bool = True,
) -> HellaSwagScore:
    """Accuracy of `model` on `items` under a scoring mode (see the module docstring)."""
    per_item = [item_rows(item, enc, mode) for item in items]
    rows = [row for item_rows_ in per_item for row in item_rows_]
    with tqdm(
        total=len(items), desc=f"hellaswag ({mode})", unit="item", disable=not show_progress
    ) as bar:
        ll = packing.score_rows(
            model, rows, batch_items * NUM_ENDINGS, device, bar, rows_per_step=NUM_ENDINGS
        )
    ll = ll.reshape(len(items), NUM_ENDINGS)
    norm = np.stack([normaliser(it, r, mode) for it, r in zip(items, per_item, strict=True)])
    pred = ll.argmax(axis=1)  # ties go to the first ending, as np.argmax does in lm-eval
    pred_norm = (ll / norm).argmax(axis=1)
    labels = np.array([it["label"] for it in items])
    return HellaSwagScore(
        mode=mode,
        items=len(items),
        acc=float((pred == labels).mean()),
        acc_norm=float((pred_norm == labels).mean()),
        pred=pred.tolist(),
        pred_norm=pred_norm.tolist(),
        loglik=ll.tolist(),
    )


def evaluate(
    settings: HellaSwagSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    model = load_hf(model_dir).to(device)
    items_file = inputs["hellaswag"]
    items = load_items(items_file, settings.items)
    if len(items) < settings.items:
        print(f"note: {items_file} holds {len(items)} items, fewer than {settings.items}")
    result = score(model, items, gpt2_encoding(TOKENIZER_DIR), "llmc", settings.batch, device)
    labels = [it["label"] for it in items]
    correct = {  # per item, in file order: what a paired test between two runs compares
        "acc": [int(p == y) for p, y in zip(result.pred, labels, strict=True)],
        "acc_norm": [int(p == y) for p, y in zip(result.pred_norm, labels, strict=True)],
    }
    return {
        "metric": "hellaswag",
        "value": result.acc_norm,
        "acc": result.acc,
        "acc_stderr": mean_stderr(correct["acc"]),
        "acc_norm": result.acc_norm,
        "acc_norm_stderr": mean_stderr(correct["acc_norm"]),
        "items": result.items,
        "per_item": correct,
        "produced_by": produced_by(
            __name__, model_dir, "llmc", items_file=str(items_file), device=device
        ),
    }
