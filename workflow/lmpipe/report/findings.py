"""The report's verdict beside the task table's: what a reader must see first.

- Each pretraining run's FineWeb val loss against the first's, with a 95% interval: the runs'
  val_loss evaluations score the same val batches, so the per-batch differences are paired (a
  t interval over them); "cannot tell" only where the interval holds zero. A mixture's runs are
  compared on each val shard both were scored on (its sources'), never across different data.
- A fine-tuned run whose FineWeb val loss is above an untrained model's: ln(50,257), the loss of
  a uniform guess over GPT-2's vocabulary (a fresh model's is about that: 10.84 at step 0 of the
  demo).
- Chat replies that repeat across different prompts.
- Attempts that resumed past an unusable checkpoint, and the steps that cost.
- A model that ran code shipped in its folder (`arch: hf` with `trust_remote_code: true`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from scipy import stats

from lmpipe.report.runs import Run

LEVEL = 0.95  # the intervals' coverage
UNTRAINED_LOSS = math.log(50257)  # a uniform guess over GPT-2's vocabulary: 10.82


def paired_interval(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """(mean, low, high) of a - b over paired batches: a t interval at LEVEL; None if fewer than
    two pairs or the batches differ in number."""
    if len(a) != len(b) or len(a) < 2:
        return None
    d = [x - y for x, y in zip(a, b, strict=True)]
    mean, n = statistics.fmean(d), len(d)
    half = stats.t.ppf(0.5 + LEVEL / 2, n - 1) * statistics.stdev(d) / math.sqrt(n)
    return mean, mean - half, mean + half


def val_views(result: dict[str, Any]) -> dict[str | None, dict[str, Any]]:
    """A val_loss result's scores by the data they were measured on: its dataset's (a
    mixture's: each source's, its own weighted mean having no batches to pair). The text in a
    model's own tokens is other data than the same text in GPT-2's."""
    return result.get("sources") or {data_name(result): result}


def data_name(result: dict[str, Any]) -> str:
    """The val data a val_loss result was scored on: its dataset, and whose tokens (an `arch:
    hf` model's own tokens of a text are other data than GPT-2's of it)."""
    of = result.get("tokens_of")
    return str(result.get("dataset")) + (f" in {of}'s tokens" if of else "")


def val_loss_lines(run: Run, base: Run) -> list[str]:
    """`run`'s val loss against `base`'s on each val shard both were scored on (a mixture's
    sources, or the one dataset), paired by batch."""
    mine, theirs = run.evals.get("val_loss"), base.evals.get("val_loss")
    if not mine or not theirs:
        return []
    a, b = val_views(mine), val_views(theirs)
    common = [data for data in a if data in b]
    if not common:
        return [
            f"{run.name}: val loss {mine['value']:.4f} against {base.name}'s"
            f" {theirs['value']:.4f}, measured on different val data"
            f" ({data_name(mine)} and {data_name(theirs)}): no paired interval."
        ]
    # a source of a mixture is named; one dataset's val loss is said as before
    mixed = set(mine.get("sources", {})) | set(theirs.get("sources", {}))
    return [
        paired_line(run.name, a[data], base.name, b[data], data if data in mixed else None)
        for data in common
    ]


def paired_line(
    name: str, mine: dict[str, Any], base: str, theirs: dict[str, Any], source: str | None
) -> str:
    on = "FineWeb val loss" if source is None else f"val loss on {source}"
    head = f"{name}: {on} {mine['value']:.4f} against {base}'s {theirs['value']:.4f}"
    same_tokens = mine.get("tokens") == theirs.get("tokens")
    interval = same_tokens and paired_interval(
        mine.get("batch_losses") or [], theirs.get("batch_losses") or []
    )
    if not interval:
        return head + (
            ": no paired batches to give an interval (different val tokens, or results written"
            " without per-batch losses)."
        )
    mean, low, high = interval
    n = len(mine["batch_losses"])
    how = f"{mean:+.4f} a batch, {LEVEL:.0%} interval {low:+.4f} to {high:+.4f} over {n} batches"
    if low > 0:
        word = f"worse than {base}"
    elif high < 0:
        word = f"better than {base}"
    else:
        word = f"the val tokens cannot tell it from {base}"
    return f"{head} ({how}): {word}."


def lost_pretraining(run: Run, runs: list[Run]) -> str | None:
    """A fine-tuned run whose FineWeb val loss is above an untrained model's."""
    loss = run.evals.get("val_loss", {}).get("value")
    if not run.fine_tuned or loss is None or loss <= UNTRAINED_LOSS:
        return None
    base_name = (run.settings.get("base") or {}).get("run")
    base = next((r for r in runs if r.name == base_name), None)
    base_loss = base.evals.get("val_loss", {}).get("value") if base else None
    was = f"; its base {base_name} had {base_loss:.2f}" if base_loss is not None else ""
    return (
        f"{run.name} lost its pretraining: its FineWeb val loss {loss:.2f} is above an untrained"
        f" model's ({UNTRAINED_LOSS:.2f}, a uniform guess over the vocabulary){was}."
    )


def repeated_replies(run: Run) -> str | None:
    samples = run.evals.get("chat_samples", {}).get("samples") or []
    replies = [s.get("reply", "").strip() for s in samples]
    distinct = len(set(replies))
    if len(replies) < 2 or distinct == len(replies):
        return None
    said = "the same reply" if distinct == 1 else f"{distinct} distinct replies"
    return f"{run.name} repeats itself: its {len(replies)} chat prompts get {said} (chat samples)."


def skipped_checkpoints(run: Run) -> str | None:
    """A run that resumed past an unusable checkpoint (lmpipe.report.restarts.skipped)."""
    skips = run.restarts.skipped if run.restarts else []
    if not skips:
        return None
    redone = sum(k.steps_redone for k in skips)
    return f"{run.name} skipped unusable checkpoints and redid {redone} step(s): " + "; ".join(
        str(k) for k in skips
    )


def remote_code(run: Run) -> str | None:
    """A run whose model ran Python code shipped in its folder (`arch: hf`, trust_remote_code)."""
    model = run.settings.get("model") or {}
    if not model.get("trust_remote_code"):
        return None
    return (
        f"{run.name} ran Python code shipped in its model folder {model.get('path')}"
        " (model.trust_remote_code: true)."
    )


def findings(runs: list[Run]) -> list[str]:
    """The verdict's lines: each pretraining run's val loss against the first's, then flags."""
    pretrained = [r for r in runs if not r.fine_tuned]
    lines = [line for r in pretrained[1:] for line in val_loss_lines(r, pretrained[0])]
    lines += [lost_pretraining(r, runs) for r in runs]
    lines += [repeated_replies(r) for r in runs]
    lines += [skipped_checkpoints(r) for r in runs]
    lines += [remote_code(r) for r in runs]
    return [line for line in lines if line]
