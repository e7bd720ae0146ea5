"""The suite's native scorer: lm-eval's requests and scoring, batched over many items.

Every choice of every item is a (context tokens, continuation tokens) row, tokenized as lm-eval's
`_encode_pair` does (a context's trailing whitespace moved to the continuation; the whole text
encoded and the continuation cut at the length of the context's own tokens; the context's own
tokens as the context). The rows are scored packed as prefix trees (lmpipe.eval.packing): a
context shared by an item's choices, or a prefix shared by items, runs through the model once;
the LM head runs only where a continuation token is predicted, once a position (the one softmax
that MMLU's, CommonsenseQA's and BoolQ's one-token choices are read from). A row longer than the
model is first truncated from the left of its context, as lm-eval truncates it.

A task that tokenizes its own way gives its items' rows itself (`Item.rows`; HellaSwag's llm.c
scoring, lmpipe.eval.hellaswag.task_data) and its own acc_norm divisors (`Item.choice_lengths`):
the packing, the log-likelihoods and the choice are the same code for every task.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from lmpipe.data.tokenizer import Tokenizer
from lmpipe.eval import packing
from lmpipe.eval.suite.data import TaskData
from lmpipe.eval.suite.metrics import TaskScore, choose
from lmpipe.eval.suite.tasks import Item

Row = packing.Row


def encode_pair(enc: Tokenizer, context: str, continuation: str) -> Row:
    """lm-eval's `loglikelihood` + `_encode_pair` for a causal model (lm-eval's `hf` model adds
    no BOS token to the pairs)."""
    if context == "":  # lm-eval's prefix token as the context: the BOS token, else end of text
        prefix = getattr(enc, "bos_token_id", None)
        prefix = enc.eot_token if prefix is None else prefix
        cont = enc.encode_ordinary(continuation)
        return ([prefix], cont) if cont[0] != prefix else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = enc.encode_ordinary(context + continuation)
    ctx = enc.encode_ordinary(context)
    return ctx, whole[len(ctx) :]


def choice_rows(item: Item, enc: Tokenizer) -> list[Row]:
    """An item's rows, one a choice: the task's own (`Item.rows`), else lm-eval's encoding."""
    if item.rows is not None:
        return [(list(ctx), list(cont)) for ctx, cont in item.rows]
    return [
        encode_pair(enc, ctx, cont)
        for ctx, cont in zip(item.contexts, item.continuations, strict=True)
    ]


def item_rows(items: list[Item], enc: Tokenizer) -> list[Row]:
    """Every choice of every item, in order."""
    return [row for item in items for row in choice_rows(item, enc)]


def check_choices_fit(data: TaskData, rows: list[Row], block_size: int) -> None:
    """A choice longer than the model cannot be scored (lm-eval cannot either): an error that
    names the task and the item, before any forward."""
    start = 0
    for k, item in enumerate(data.items):
        for _, cont in rows[start : start + len(item.continuations)]:
            if len(cont) > block_size:
                raise ValueError(
                    f"task {data.name}: item {k}: a choice of {len(cont)} tokens is longer"
                    f" than the model's block_size {block_size}"
                )
        start += len(item.continuations)


def score_task(
    model: torch.nn.Module,
    data: TaskData,
    enc: Tokenizer,
    batch_rows: int = 32,
    device: str | torch.device = "cpu",
    show_progress: bool = True,
    rows: list[Row] | None = None,
    plan: list[list[packing.Pack]] | None = None,
) -> TaskScore:
    """The per-item log-likelihoods, choices and right/wrong calls of one task. `rows`: the
    items' rows as `item_rows` makes them, and `plan` their `packing.forward_plan`, when the
    caller keeps them (an eval repeated during training tokenizes and packs once)."""
    rows = item_rows(data.items, enc) if rows is None else rows
    check_choices_fit(data, rows, model.config.block_size)
    with tqdm(total=len(rows), desc=data.name, unit="choice", disable=not show_progress) as bar:
        ll = packing.score_rows(model, rows, batch_rows, device, bar, plan=plan)
    score = TaskScore(data.name, [], [], [], [], [], dict(data.subjects))
    start = 0
    for item in data.items:
        item_ll = ll[start : start + len(item.continuations)].tolist()
        start += len(item.continuations)
        pred, pred_norm = choose(item_ll, item.choice_lengths)
        score.loglik.append(item_ll)
        score.pred.append(pred)
        score.pred_norm.append(pred_norm)
        score.acc.append(int(pred == item.gold))
        score.acc_norm.append(int(pred_norm == item.gold))
    return score
