"""HellaSwag: load the rowanz jsonl, and make it a task of the native multiple-choice scorer.

`evaluate` (the `hellaswag` evaluation) scores the run's converted model with llm.c's scoring.

Each item is a context and four endings; the model picks the ending it finds most likely.
`task_data` turns the items into the native scorer's task (lmpipe.eval.suite.native: the rows
packed as prefix trees, lmpipe.eval.packing; the log-likelihoods; acc and acc_norm picked as
lm-eval picks them), under one of two scoring options:

- `llmc` (llm.c's `dev/data/hellaswag.py`; the figure llm.c quotes, in lmpipe's references):
  tokens of `ctx` then of `" " + ending`, encoded apart (the items carry these rows themselves,
  `Item.rows`); acc from the summed log-likelihood, acc_norm from the mean per ending token
  (`Item.choice_lengths`: the ending's tokens).
- `lm_eval` (the lm-eval harness's `hellaswag` task, reproduced to prove the scorer right):
  its preprocessing (`activity_label: ctx_a Ctx_b`, WikiHow `[title]` and bracket artefacts
  removed) and its multiple-choice request, tokenized as every suite task is (lm-eval's
  `_encode_pair`: the whole text, minus the context's tokens); acc_norm divides by the ending's
  length in characters.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lmpipe.data.tokenizer import Tokenizer, model_tokenizer
from lmpipe.eval.results import mean_stderr, produced_by
from lmpipe.eval.suite import native
from lmpipe.eval.suite.data import TaskData
from lmpipe.eval.suite.metrics import TaskScore
from lmpipe.eval.suite.tasks import Item, choice_item
from lmpipe.models import load_hf
from lmpipe.paths import TOKENIZER_DIR
from lmpipe.registry import HellaSwagSettings

NAME = "hellaswag"
MODES = ("llmc", "lm_eval")  # the scoring options
NUM_ENDINGS = 4
METRICS = ("acc", "acc_norm")  # acc_norm the headline, in llm.c's and lm-eval's figures
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


def llmc_rows(item: dict, enc: Tokenizer) -> list[tuple[list[int], list[int]]]:
    """llm.c's four rows of an item: the context's tokens, then those of " " + ending, each
    encoded alone (lm-eval's rows are the native scorer's `encode_pair` of its request)."""
    ctx = enc.encode_ordinary(item["ctx"])
    return [(ctx, enc.encode_ordinary(" " + e)) for e in item["endings"]]


# ----------------------------------------------------------------------------------------------
# a task of the native multiple-choice scorer


def task_item(item: dict, enc: Tokenizer, scoring: str) -> Item:
    """One item as the native scorer's `Item` under a scoring option (module docstring)."""
    if scoring == "lm_eval":  # acc_norm by the choices' characters
        query, choices = lm_eval_prompt(item)
        return choice_item(query, choices, item["label"])  # lm-eval's multiple_choice request
    if scoring != "llmc":
        raise ValueError(f"unknown scoring mode {scoring!r} (expected one of {', '.join(MODES)})")
    rows = llmc_rows(item, enc)
    return Item(
        contexts=(item["ctx"],) * NUM_ENDINGS,
        continuations=tuple(" " + e for e in item["endings"]),
        gold=item["label"],
        choice_lengths=tuple(len(cont) for _, cont in rows),  # acc_norm by the ending's tokens
        rows=tuple((tuple(ctx), tuple(cont)) for ctx, cont in rows),
    )


def task_data(items: list[dict], enc: Tokenizer, scoring: str = "llmc") -> TaskData:
    """HellaSwag's `items` (load_items) as a task of the native scorer, in order:
    `native.score_task(model, task_data(items, enc), enc)` scores them, and
    `native.item_rows(data.items, enc)` gives their rows, four an item."""
    return TaskData(NAME, [task_item(item, enc, scoring) for item in items], files={})


def item_id(item: dict, place: int) -> str:
    """An item's id, what the report pairs two runs' per-item results by: its source and `ind`
    ("wikihow/10338"; `ind` alone repeats across ActivityNet and WikiHow items), else its place
    in the file ("#17")."""
    source, ind = item.get("source_id"), item.get("ind")
    if isinstance(source, str) and ind is not None:
        return f"{source.split('~', 1)[0]}/{ind}"
    return f"#{place}"


def result(score: TaskScore, ids: list[str]) -> dict[str, Any]:
    """The result file's figures from the per-item score: acc, acc_norm (the value), their
    standard errors, the items, and `per_item` right answers in file order with the items' ids
    (what a paired test between two runs compares)."""
    correct = {metric: list(getattr(score, metric)) for metric in METRICS}
    acc, acc_norm = (sum(correct[m]) / score.items for m in METRICS)
    return {
        "metric": NAME,
        "value": acc_norm,
        "acc": acc,
        "acc_stderr": mean_stderr(correct["acc"]),
        "acc_norm": acc_norm,
        "acc_norm_stderr": mean_stderr(correct["acc_norm"]),
        "items": score.items,
        "per_item": {"ids": ids} | correct,
    }


def evaluate(
    settings: HellaSwagSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    """The `hellaswag` evaluation: the first `settings.items` items, llm.c's scoring."""
    model = load_hf(model_dir).to(device)
    items_file = inputs["hellaswag"]
    items = load_items(items_file, settings.items)
    if len(items) < settings.items:
        print(f"note: {items_file} holds {len(items)} items, fewer than {settings.items}")
    enc = model_tokenizer(model_dir, TOKENIZER_DIR)  # GPT-2's, or an hf model's own
    # settings.batch counts items; the scorer's batch counts rows, four an item
    batch_rows = settings.batch * NUM_ENDINGS
    score = native.score_task(model, task_data(items, enc, "llmc"), enc, batch_rows, device)
    return result(score, [item_id(it, i) for i, it in enumerate(items)]) | {
        "produced_by": produced_by(
            __name__, model_dir, "llmc", items_file=str(items_file), device=device
        ),
    }
