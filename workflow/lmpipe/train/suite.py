"""Suite tasks during training (`train.eval_tasks`), at the steps of HellaSwag during training:
the model as it trains, scored by lmpipe.eval.suite's own native scorer (`native.score_task`:
lm-eval's requests, log-likelihoods, acc and acc_norm), the items shared out over the ranks.

The rule of lmpipe.train.hellaswag: each rank takes a strided share of a task's items
(items[rank::world_size]), padded to as many items as every other rank's with copies of the
first item, which are scored and never counted; the counts of right answers are summed over the
ranks. The scorer packs the rows by their tokens (lmpipe.eval.packing), so equal items need not
mean equal forwards: a rank with fewer runs empty ones up to the most of any rank
(`as_many_forwards_as_any_rank`, as HellaSwag's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval import packing
from lmpipe.eval.suite import native
from lmpipe.eval.suite.data import TaskData, load_task
from lmpipe.eval.suite.tasks import TASKS, Item
from lmpipe.paths import TOKENIZER_DIR
from lmpipe.train.hellaswag import as_many_forwards_as_any_rank, root_unsharded


@dataclass
class SuiteShare:
    """This rank's share of one task's items, padded; `counted[i]`: item i is not padding."""

    name: str
    items: list[Item]
    counted: list[bool]
    total: int  # items over all ranks
    rows: list[native.Row]  # every choice of every item, as the native scorer tokenizes them:
    # once, at the start (tokenizing the ten core tasks' 34,392 rows takes ~2.6 s)
    # their packing.forward_plan, made at the first eval (as HellaSwagShare's)
    plan: list[list[packing.Pack]] | None = None

    @property
    def headline(self) -> str:
        """The task's figure: acc_norm where lm-eval's task has it, else acc (the suite's)."""
        return TASKS[self.name].headline


def task_share(name: str, items: list[Item], rank: int, world_size: int) -> SuiteShare:
    """Rank `rank`'s share of a task's `items`, padded to ceil(len(items) / world_size)."""
    mine = items[rank::world_size]
    padding = math.ceil(len(items) / world_size) - len(mine)
    share_items = mine + [items[0]] * padding
    counted = [True] * len(mine) + [False] * padding
    rows = native.item_rows(share_items, gpt2_encoding(TOKENIZER_DIR))
    return SuiteShare(name, share_items, counted, len(items), rows)


def suite_shares(
    manifest: Path, names: tuple[str, ...], limit: int | None, rank: int, world_size: int
) -> list[SuiteShare]:
    """Each task's share, from the suite's data (lmpipe.eval.suite.data: the first `limit` items
    of each task, MMLU's of each subject; None: all). A task that cannot be read stops the run
    before it trains: the config asked for it."""
    return [
        task_share(name, load_task(manifest, name, limit).items, rank, world_size) for name in names
    ]


@torch.no_grad()
def task_correct(
    model: torch.nn.Module, share: SuiteShare, batch_rows: int, device: torch.device
) -> dict[str, int]:
    """Items right over all ranks, by each of the task's metrics (lm-eval's acc, acc_norm). The
    model scores in eval mode and is left in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        if share.plan is None:
            share.plan = packing.forward_plan(model, share.rows, batch_rows)
        with root_unsharded(model), as_many_forwards_as_any_rank(model, len(share.plan), device):
            data = TaskData(share.name, share.items, {})
            enc = gpt2_encoding(TOKENIZER_DIR)
            score = native.score_task(
                model, data, enc, batch_rows, device, False, rows=share.rows, plan=share.plan
            )
    finally:
        model.train(was_training)
    metrics = TASKS[share.name].metrics
    counts = torch.tensor(
        [
            sum(r for r, c in zip(getattr(score, m), share.counted, strict=True) if c)
            for m in metrics
        ],
        device=device,
    )
    dist.all_reduce(counts)  # SUM
    return dict(zip(metrics, counts.tolist(), strict=True))
