"""The suite's native scorer: lm-eval's requests and scoring, batched over many items.

Every choice of every item is a (context tokens, continuation tokens) row, tokenized as lm-eval's
`_encode_pair` does (a context's trailing whitespace moved to the continuation; the whole text
encoded and the continuation cut at the length of the context's own tokens; the context's own
tokens as the context). Rows are then scored two ways:

- rows whose continuation is one token and whose context is shared (MMLU's and CommonsenseQA's
  letters, BoolQ's yes/no): one forward pass a context, the head at its last position only, each
  choice's log-probability read from that one softmax (lm-eval's harness shares these too);
- every other row through HellaSwag's `continuation_logprobs`: many items' rows a batch, sorted by
  length, the head at the continuation's positions only.

Both truncate a too-long row from the left of its context, as lm-eval does.
"""

from __future__ import annotations

import math

import numpy as np
import tiktoken
import torch
from tqdm import tqdm

from lmpipe.data.tokenizer import EOT_ID
from lmpipe.eval.hellaswag import continuation_logprobs
from lmpipe.eval.suite.data import TaskData
from lmpipe.eval.suite.metrics import TaskScore, choose
from lmpipe.eval.suite.tasks import Item

Row = tuple[list[int], list[int]]


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


@torch.no_grad()
def last_position_logprobs(
    model: torch.nn.Module,
    contexts: list[list[int]],
    targets: list[list[int]],
    batch_rows: int,
    device: str | torch.device = "cpu",
    progress: tqdm | None = None,
) -> list[np.ndarray]:
    """log p(target | context) for each context and each of its one-token targets: one forward pass
    a context (left-truncated to block_size, as a row (context, [target]) would be), the head at
    its last position only."""
    T = model.config.block_size
    out: list[np.ndarray] = [np.zeros(0)] * len(contexts)
    order = sorted(range(len(contexts)), key=lambda i: -len(contexts[i]))
    for start in range(0, len(order), batch_rows):
        chunk = order[start : start + batch_rows]
        seqs = [contexts[i][-T:] for i in chunk]
        idx = torch.zeros((len(seqs), max(len(s) for s in seqs)), dtype=torch.long)
        for b, seq in enumerate(seqs):
            idx[b, : len(seq)] = torch.tensor(seq)
        h = model.hidden_states(idx.to(device))  # (B, L, C)
        last = torch.tensor([len(s) - 1 for s in seqs], device=device)
        logp = torch.log_softmax(model.head(h[torch.arange(len(seqs), device=device), last]), -1)
        rows = torch.tensor([b for b, i in enumerate(chunk) for _ in targets[i]], device=device)
        cols = torch.tensor([t for i in chunk for t in targets[i]], device=device)
        picked = logp[rows, cols].double().cpu().numpy()
        start = 0
        for i in chunk:
            out[i] = picked[start : start + len(targets[i])]
            start += len(targets[i])
        if progress is not None:
            progress.update(sum(len(targets[i]) for i in chunk))
    return out


def split_rows(rows: list[Row]) -> tuple[dict[tuple[int, ...], list[int]], list[int]]:
    """The rows with one-token continuations by their shared context (one forward a context),
    and the indices of the others (a row a batch slot)."""
    shared: dict[tuple[int, ...], list[int]] = {}
    others = []
    for i, (ctx, cont) in enumerate(rows):
        if len(cont) == 1:
            shared.setdefault(tuple(ctx), []).append(i)
        else:
            others.append(i)
    return shared, others


def forward_passes(rows: list[Row], batch_rows: int) -> int:
    """The model forwards `row_logprobs(model, rows, batch_rows)` runs (a batch a forward): what
    FSDP ranks must equal when each scores its own rows (lmpipe.train.suite)."""
    shared, others = split_rows(rows)
    return math.ceil(len(shared) / batch_rows) + math.ceil(len(others) / batch_rows)


def row_logprobs(
    model: torch.nn.Module,
    rows: list[Row],
    batch_rows: int,
    device: str | torch.device = "cpu",
    progress: tqdm | None = None,
) -> np.ndarray:
    """Summed log-probability of each row's continuation (see the module docstring)."""
    out = np.zeros(len(rows), dtype=np.float64)
    shared, others = split_rows(rows)
    if shared:
        contexts = [list(c) for c in shared]
        targets = [[rows[i][1][0] for i in idx] for idx in shared.values()]
        logps = last_position_logprobs(model, contexts, targets, batch_rows, device, progress)
        for idx, logp in zip(shared.values(), logps, strict=True):
            out[idx] = logp
    if others:
        out[others] = continuation_logprobs(
            model, [rows[i] for i in others], batch_rows, device, progress, rows_per_step=1
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
