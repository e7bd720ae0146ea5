"""HellaSwag during training (`train.eval_every`), as llm.c does: the model as it trains, scored
with lmpipe.eval.hellaswag's own llm.c scoring, the items shared out over the ranks.

Each rank takes a strided share of the items, padded to the same count, and the counts of right
answers are summed over the ranks. Under FSDP every forward all-gathers parameters, so every
rank must run as many forwards; the scorer packs rows by their tokens (lmpipe.eval.packing),
so equal items need not mean equal forwards, and a rank with fewer runs empty ones up to the
most of any rank (`as_many_forwards_as_any_rank`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval import packing
from lmpipe.eval.hellaswag import NUM_ENDINGS, item_rows, normaliser
from lmpipe.paths import TOKENIZER_DIR

Row = tuple[list[int], list[int]]  # (context tokens, ending tokens)


@dataclass
class HellaSwagShare:
    """This rank's strided share of the items (items[rank::world_size]) as llm.c's rows, padded
    to as many items as every other rank's. A padding item is scored and never counted."""

    rows: list[Row]  # NUM_ENDINGS an item, in item order
    lengths: list[float]  # acc_norm's divisor of each row (its ending's tokens)
    labels: list[int]  # one an item; -1: padding
    total: int  # items over all ranks
    # the rows' packing.forward_plan, made at the first eval (the model's shape and the batch
    # are the run's): every later eval scores the same packs
    plan: list[list[packing.Pack]] | None = None


def hellaswag_share(items: list[dict[str, Any]], rank: int, world_size: int) -> HellaSwagShare:
    """Rank `rank`'s share of `items` (lmpipe.eval.hellaswag.load_items), padded."""
    enc = gpt2_encoding(TOKENIZER_DIR)
    mine = items[rank::world_size]
    padding = math.ceil(len(items) / world_size) - len(mine)
    share = HellaSwagShare([], [], [], len(items))
    for item, label in [(it, it["label"]) for it in mine] + [(items[0], -1)] * padding:
        rows = item_rows(item, enc, "llmc")
        share.rows += rows
        share.lengths += normaliser(item, rows, "llmc").tolist()
        share.labels.append(label)
    return share


@contextmanager
def root_unsharded(model: torch.nn.Module) -> Iterator[None]:
    """The FSDP root's own parameters (embeddings, final norm, the tied head) gathered while the
    scorer calls `hidden_states` and `head`, which bypass the root's forward hook that would
    gather them (each block still gathers its own in its hook). The root must have run a forward
    once before (FSDP2's lazy init): the loop's validation at step 0, or a training step."""
    if not isinstance(model, FSDPModule):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


@contextmanager
def as_many_forwards_as_any_rank(
    model: torch.nn.Module, forwards: int, device: torch.device
) -> Iterator[None]:
    """Around a rank's `forwards` forward passes: then empty ones (a token each) up to the most
    any rank runs (an all-reduce MAX first). Under FSDP each forward all-gathers, and a rank
    that stopped early would leave the others waiting in an all-gather."""
    most = torch.tensor(forwards, device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    yield
    empty = torch.zeros((1, 1), dtype=torch.long, device=device)
    for _ in range(int(most.item()) - forwards):  # a host sync: the count is an int
        model.hidden_states(empty)


def hellaswag_correct(
    model: torch.nn.Module, share: HellaSwagShare, batch_items: int, device: torch.device
) -> tuple[int, int]:
    """Items right over all ranks: (by acc_norm, by acc). The model scores in eval mode under
    no_grad and is left in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        batch_rows = batch_items * NUM_ENDINGS
        if share.plan is None:
            share.plan = packing.forward_plan(model, share.rows, batch_rows)
        with root_unsharded(model), as_many_forwards_as_any_rank(model, len(share.plan), device):
            ll = packing.score_rows(model, share.rows, batch_rows, device, plan=share.plan)
    finally:
        model.train(was_training)
    ll = ll.reshape(-1, NUM_ENDINGS)
    lengths = np.array(share.lengths).reshape(-1, NUM_ENDINGS)
    labels = np.array(share.labels)
    counted = labels >= 0
    right_norm = ((ll / lengths).argmax(axis=1) == labels) & counted
    right = (ll.argmax(axis=1) == labels) & counted
    counts = torch.tensor([int(right_norm.sum()), int(right.sum())], device=device)
    dist.all_reduce(counts)  # SUM
    norm, plain = counts.tolist()
    return norm, plain
