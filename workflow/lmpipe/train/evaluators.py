"""Evaluations on the model as it trains: one evaluator class for every multiple-choice task.

The loop (lmpipe.train.loop) knows none of them by name: the worker builds them from the
evaluations the train job names (lmpipe.registry: an Evaluation's `during_training` scorer, on
the schedule of its section's `during_training`), and the loop asks each whether it is `due` at a
step and calls it. An evaluator returns the fields of its metrics line and its log lines.

A multiple-choice task is rows (every choice of every item, a (context, continuation) pair of
tokens), the choices of each item, the right one, and each choice's acc_norm divisor: HellaSwag
with llm.c's scoring (the ending's tokens) and each suite task with lm-eval's (its characters)
are scored by the same `ChoiceEvaluator`. Each rank takes a strided share of a task's items
(items[rank::world_size]), padded to as many items as every other rank's with copies of the first
item, which are scored and never counted. The rows are scored packed (lmpipe.eval.packing, the
suite's native scorer's path): under FSDP every forward all-gathers parameters, so every rank
must run as many forwards, and a rank whose share packs into fewer runs empty ones up to the most
of any rank (`as_many_forwards_as_any_rank`). The packing plan is made at the first eval and kept.
The counts of right answers are summed over the data-parallel group.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from lmpipe.config import TrainConfig, TrainJob
from lmpipe.data.tokenizer import Tokenizer, gpt2_encoding, model_tokenizer
from lmpipe.eval import hellaswag as hellaswag_eval
from lmpipe.eval import packing
from lmpipe.eval.suite import native
from lmpipe.eval.suite.data import TaskData, load_task
from lmpipe.eval.suite.tasks import TASKS as SUITE_TASKS
from lmpipe.eval.suite.tasks import Item
from lmpipe.paths import TOKENIZER_DIR
from lmpipe.registry import EVALUATIONS, code
from lmpipe.train.parallel import Dist

Row = packing.Row


@dataclass
class Scores:
    """What an evaluation at a step gives the loop: its metrics line's fields (the loop adds
    step, tokens, eval_s and wall_s) and its log lines (the loop prefixes the step)."""

    fields: dict[str, Any]
    lines: list[str]


class Evaluator(Protocol):
    """An evaluation the loop runs as the model trains."""

    name: str

    def due(self, step: int, max_steps: int) -> bool:
        """Whether it runs after `step` (0: before the first)."""

    def __call__(self, model: torch.nn.Module, step: int) -> Scores:
        """The model's scores now, the same on every rank."""


# ---- a multiple-choice task --------------------------------------------------------------------


@dataclass
class ChoiceTask:
    """A multiple-choice task as the native scorer takes it: its items (`Item`: a (context,
    continuation) request a choice, the right one, each choice's acc_norm divisor, and the rows
    where the task tokenizes its own way, as llm.c's HellaSwag)."""

    name: str  # the prefix of its metrics keys: "hellaswag", "suite/arc_easy"
    items: list[Item]
    tokenizer: Tokenizer  # the model's: GPT-2's BPE, or an `arch: hf` model's own
    metrics: tuple[str, ...] = ("acc", "acc_norm")  # counted; "acc_norm" also the headline

    @property
    def headline(self) -> str:
        return "acc_norm" if "acc_norm" in self.metrics else "acc"


def run_tokenizer(inputs: dict[str, Path]) -> Tokenizer:
    """The tokenizer the model trains in: an `arch: hf` model's own (the `tokenizer` input, its
    folder: lmpipe.data.tokenizer.model_tokenizer), else GPT-2's BPE."""
    folder = inputs.get("tokenizer")
    return (
        gpt2_encoding(TOKENIZER_DIR) if folder is None else model_tokenizer(folder, TOKENIZER_DIR)
    )


def hellaswag_task(items_file: Path, limit: int, tok: Tokenizer) -> ChoiceTask:
    """HellaSwag as llm.c scores it (lmpipe.eval.hellaswag's "llmc" scoring: rows (enc(ctx),
    enc(" " + ending)), acc_norm by the ending's tokens), the file's first `limit` items, in
    the tokens of `tok`."""
    items = hellaswag_eval.load_items(items_file, limit)
    data = hellaswag_eval.task_data(items, tok, "llmc")
    return ChoiceTask(hellaswag_eval.NAME, data.items, tok, hellaswag_eval.METRICS)


def suite_task(manifest: Path, name: str, limit: int | None, tok: Tokenizer) -> ChoiceTask:
    """A suite task as its native scorer scores it (lm-eval's requests, acc and acc_norm), the
    first `limit` items (MMLU: of each subject; None: all) of the suite's data. A task that
    cannot be read stops the run before it trains: the config asked for it."""
    items = load_task(manifest, name, limit).items
    return ChoiceTask(f"suite/{name}", items, tok, SUITE_TASKS[name].metrics)


# ---- a rank's share, scored --------------------------------------------------------------------


@dataclass
class Share:
    """This rank's share of a task's items, padded; `counted[i]`: item i is not padding."""

    task: ChoiceTask
    items: list[Item]
    counted: list[bool]
    total: int  # items over all ranks
    rows: list[Row]  # every choice of every item, tokenized once (the ten core tasks: ~2.6 s)
    # the rows' packing.forward_plan, made at the first eval (the model's shape and the batch are
    # the run's): every later eval scores the same packs
    plan: list[list[packing.Pack]] | None = None


def share_of(task: ChoiceTask, rank: int, world_size: int) -> Share:
    """Rank `rank`'s share of `task`: items[rank::world_size], padded with copies of the first
    item to ceil(items / world_size)."""
    mine = task.items[rank::world_size]
    padding = math.ceil(len(task.items) / world_size) - len(mine)
    items = mine + [task.items[0]] * padding
    rows = native.item_rows(items, task.tokenizer)
    return Share(task, items, [True] * len(mine) + [False] * padding, len(task.items), rows)


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
    model: torch.nn.Module, forwards: int, device: torch.device, group: Any = None
) -> Iterator[None]:
    """Around a rank's `forwards` forward passes: then empty ones (a token each) up to the most
    any rank runs (an all-reduce MAX first). Under FSDP each forward all-gathers, and a rank
    that stopped early would leave the others waiting in an all-gather."""
    most = torch.tensor(forwards, device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
    yield
    empty = torch.zeros((1, 1), dtype=torch.long, device=device)
    for _ in range(int(most.item()) - forwards):  # a host sync: the count is an int
        model.hidden_states(empty)


@torch.no_grad()
def count_right(
    model: torch.nn.Module, share: Share, batch_rows: int, device: torch.device, group: Any = None
) -> dict[str, int]:
    """Items right over the group's ranks, by each of the task's metrics. The model scores in
    eval mode and is left in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        if share.plan is None:
            share.plan = packing.forward_plan(model, share.rows, batch_rows)
        with (
            root_unsharded(model),
            as_many_forwards_as_any_rank(model, len(share.plan), device, group),
        ):
            data = TaskData(share.task.name, share.items, {})
            score = native.score_task(
                model,
                data,
                share.task.tokenizer,
                batch_rows,
                device,
                False,
                rows=share.rows,
                plan=share.plan,
            )
    finally:
        model.train(was_training)
    right = {
        metric: sum(r for r, c in zip(getattr(score, metric), share.counted, strict=True) if c)
        for metric in share.task.metrics
    }
    counts = torch.tensor(list(right.values()), device=device)
    dist.all_reduce(counts, group=group)  # SUM
    return dict(zip(right, counts.tolist(), strict=True))


# ---- the evaluator -----------------------------------------------------------------------------


class ChoiceEvaluator:
    """Multiple-choice tasks on the model as it trains, one metrics line for all of them: a
    task's headline (`<name>`: acc_norm where it has it, else acc), `<name>_acc` and
    `<name>_items`; a log line a task."""

    def __init__(
        self, name: str, tasks: list[ChoiceTask], every: int, d: Dist, batch_rows: int
    ) -> None:
        self.name, self.every, self.d, self.batch_rows = name, every, d, batch_rows
        self.shares = [share_of(task, d.rank, d.world_size) for task in tasks]

    def due(self, step: int, max_steps: int) -> bool:
        return step % self.every == 0 or step == max_steps

    def __call__(self, model: torch.nn.Module, step: int) -> Scores:
        scores = Scores({}, [])
        for share in self.shares:
            t0 = time.time()
            right = count_right(model, share, self.batch_rows, self.d.device, self.d.group)
            n, key, headline = share.total, share.task.name, share.task.headline
            head = right[headline]
            scores.fields |= {key: head / n, f"{key}_acc": right["acc"] / n, f"{key}_items": n}
            acc = f", acc {right['acc'] / n:.4f}" if headline != "acc" else ""
            scores.lines.append(
                f"{key} {headline} {head / n:.4f} ({head}/{n}){acc} | {time.time() - t0:.2f} s"
            )
        return scores


def batch_rows(train: TrainConfig) -> int:
    """A rank's rows a forward: micro_batch items of HellaSwag's 4 endings."""
    return 4 * train.micro_batch


def hellaswag(settings: dict, inputs: dict[str, Path], d: Dist, train: TrainConfig) -> Evaluator:
    """HellaSwag during training (llm.c's): the first `items` of the run's items file."""
    task = hellaswag_task(inputs["hellaswag"], settings["items"], run_tokenizer(inputs))
    return ChoiceEvaluator("hellaswag", [task], settings["every"], d, batch_rows(train))


def suite(settings: dict, inputs: dict[str, Path], d: Dist, train: TrainConfig) -> Evaluator:
    """The suite's `tasks` during training, the first `items` of each, from its data."""
    tok = run_tokenizer(inputs)
    tasks = [
        suite_task(inputs["suite"], name, settings["items"], tok) for name in settings["tasks"]
    ]
    return ChoiceEvaluator("suite", tasks, settings["every"], d, batch_rows(train))


def build_evaluators(
    job: TrainJob, inputs: dict[str, Path], d: Dist, train: TrainConfig
) -> list[Evaluator]:
    """The evaluators of the evaluations the train job scores as it trains, in the registry's
    order, each built by its entry's `during_training.build` from its settings and its inputs
    (`--eval-input kind=path`; an `arch: hf` model's folder as the `tokenizer` its tasks are
    tokenized with); an input missing stops the run before it trains."""
    if job.model.arch == "hf":
        inputs = inputs | {"tokenizer": Path(job.model.path)}
    evaluators = []
    for name, entry in EVALUATIONS.items():
        if name not in job.during_training:
            continue
        settings = job.during_training[name]
        for kind in entry.inputs:
            if kind not in inputs:
                raise ValueError(
                    f"runs.{job.run}.eval.{entry.section}.during_training.every is"
                    f" {settings['every']}: {name} during training needs its {kind} input"
                    f" (--eval-input {kind}=PATH)"
                )
        evaluators.append(code(entry.during_training.build)(settings, inputs, d, train))
    return evaluators
