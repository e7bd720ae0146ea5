"""The suite's native scorer: lm-eval's requests and scoring, batched over many items.

Every choice of every item is a (context tokens, continuation tokens) row, tokenized as lm-eval's
`_encode_pair` does (a context's trailing whitespace moved to the continuation; the whole text
encoded and the continuation cut at the length of the context's own tokens; the context's own
tokens as the context). The rows are scored packed as prefix trees (lmpipe.eval.packing): a
context shared by an item's choices, or a prefix shared by items, runs through the model once;
the LM head runs only where a continuation token is predicted, once a position (the one softmax
that MMLU's, CommonsenseQA's and BoolQ's one-token choices are read from). A row longer than the
model is truncated from the left of its context, as lm-eval truncates, and scored on its own.
"""

from __future__ import annotations

import math

import numpy as np
import tiktoken
import torch
from tqdm import tqdm

from lmpipe.data.tokenizer import EOT_ID
from lmpipe.eval import packing
from lmpipe.eval.hellaswag import continuation_logprobs
from lmpipe.eval.suite.data import TaskData
from lmpipe.eval.suite.metrics import TaskScore, choose
from lmpipe.eval.suite.tasks import Item

Row = packing.Row

# nodes a pack at most: dense masked attention over a pack costs ~4 * pack * n_embd FLOPs a token
# a layer, against ~24 * n_embd**2 for the rest of the layer (+~5% at 124M)
PACK_TOKENS = 256


def encode_pair(enc: tiktoken.Encoding, context: str, continuation: str) -> Row:
    """lm-eval's `loglikelihood` + `_encode_pair` for a causal model without a BOS token."""
    if context == "":  # the prefix token (end of text) as the context
        cont = enc.encode_ordinary(continuation)
        return ([EOT_ID], cont) if cont[0] != EOT_ID else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = enc.encode_ordinary(context + continuation)
    ctx = enc.encode_ordinary(context)
    return ctx, whole[len(ctx) :]


def item_rows(items: list[Item], enc: tiktoken.Encoding) -> list[Row]:
    """Every choice of every item, in order."""
    return [
        encode_pair(enc, ctx, cont)
        for item in items
        for ctx, cont in zip(item.contexts, item.continuations, strict=True)
    ]


def pack_size(model: torch.nn.Module) -> int:
    """Nodes a pack (lmpipe.eval.packing): the model's block_size, at most PACK_TOKENS."""
    return min(model.config.block_size, PACK_TOKENS)


def forward_passes(rows: list[Row], batch_rows: int, block_size: int, pack_tokens: int) -> int:
    """The model forwards `row_logprobs` runs on `rows` (a batch a forward): what FSDP ranks must
    equal when each scores its own rows (lmpipe.train.suite)."""
    packs, rest = packing.pack_rows(rows, pack_tokens, block_size)
    return len(packing.forward_batches(packs, batch_rows)) + math.ceil(len(rest) / batch_rows)


def row_logprobs(
    model: torch.nn.Module,
    rows: list[Row],
    batch_rows: int,
    device: str | torch.device = "cpu",
    progress: tqdm | None = None,
) -> np.ndarray:
    """Summed log-probability of each row's continuation (see the module docstring)."""
    out = np.zeros(len(rows), dtype=np.float64)
    packs, rest = packing.pack_rows(rows, pack_size(model), model.config.block_size)
    for batch in packing.forward_batches(packs, batch_rows):
        for i, logp in packing.packed_logprobs(model, batch, device):
            out[i] = logp
        if progress is not None:
            progress.update(sum(len(p.rows) for p in batch))
    if rest:  # longer than the model: truncated from the left, a row a batch slot
        out[rest] = continuation_logprobs(
            model, [rows[i] for i in rest], batch_rows, device, progress, rows_per_step=1
        )
    return out


def score_task(
    model: torch.nn.Module,
    data: TaskData,
    enc: tiktoken.Encoding,
    batch_rows: int = 32,
    device: str | torch.device = "cpu",
    show_progress: bool = True,
    rows: list[Row] | None = None,
) -> TaskScore:
    """The per-item log-likelihoods, choices and right/wrong calls of one task. `rows`: the
    items' rows as `item_rows` makes them, when the caller keeps them (an eval repeated during
    training tokenizes once)."""
    rows = item_rows(data.items, enc) if rows is None else rows
    with tqdm(total=len(rows), desc=data.name, unit="choice", disable=not show_progress) as bar:
        ll = row_logprobs(model, rows, batch_rows, device, bar)
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
