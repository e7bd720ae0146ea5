"""The chat section: each fine-tuned run beside its base, figure by figure, with intervals.

A fine-tuned run's base is its `base: {run: ...}` run, or the reference run measuring its
Hugging Face base (lmpipe.bases; found by lmpipe.report.findings.base_of) when the report lists
it. Each figure comes with its 95% interval: an accuracy (HellaSwag, GSM8K, HumanEval) Wilson's
over its items; a mean loss over documents (FineWeb val loss, its bits per byte) cluster-robust
over the documents (lmpipe.stats.cluster_mean), and so the held-out conversation loss over the
conversations; gold-answer bits per byte the t interval of the mean over items. The fine-tune's
difference from its base is paired on what both measured: the same items by id (McNemar's test
and Newcombe's interval, or the paired t-test for gold bpb: lmpipe.report.comparison) or the
same val documents or conversations (cluster-robust). Its p is that one test's, not adjusted for
the others (the task table's tests against the report's baseline are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lmpipe import stats
from lmpipe.report.comparison import (
    GOLD_BPB_LABELS,
    Score,
    gold_scores,
    mcnemar,
    paired_scores,
    paired_t,
    task_scores,
)
from lmpipe.report.findings import base_of, unpaired
from lmpipe.report.references import CHAT_REFERENCES
from lmpipe.report.runs import Run


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str  # "loss" (nats a token), "bpb" (bits per byte) or "pct" (an accuracy)


@dataclass
class Figure:
    """A run's figure and its 95% interval (None where the result gives no spread)."""

    value: float
    low: float | None = None
    high: float | None = None


@dataclass
class Difference:
    """The fine-tune minus its base, its 95% interval and p, paired on `on`."""

    diff: float
    low: float | None
    high: float | None
    p: float | None
    on: str
    note: str | None = None


FIXED = (
    Metric("sft_loss", "held-out conversation loss", "loss"),
    Metric("val_loss", "FineWeb val loss", "loss"),
    Metric("val_bpb", "FineWeb val bits per byte", "bpb"),
    Metric("hellaswag", "HellaSwag acc_norm (llm.c scoring)", "pct"),
)
GENERATIVE = (Metric("gsm8k", "GSM8K", "pct"), Metric("humaneval", "HumanEval pass@1", "pct"))


def accuracy(score: Score) -> Figure:
    """An accuracy with Wilson's interval over its items (its 0/1 items where it has them)."""
    n = len(score.correct) if score.correct else score.items
    right = sum(score.correct.values()) if score.correct else round(score.value * n)
    low, high = stats.wilson(int(right), n) if n else (None, None)
    return Figure(score.value, low, high)


def mean_over_items(score: Score) -> Figure:
    """A mean over items with its t interval (n - 1 degrees of freedom)."""
    if score.stderr is None or score.items < 2:
        return Figure(score.value)
    half = stats.t_quantile(score.items - 1) * score.stderr
    return Figure(score.value, score.value - half, score.value + half)


def doc_values(result: dict[str, Any], unit: str) -> tuple[list[float], list[int]] | None:
    """A val_loss result's per-document sums and sizes: loss in nats over tokens, or in bits
    over bytes (bits per byte); None where it has no per-document figures."""
    if unit == "loss":
        sums, sizes = result.get("doc_losses"), result.get("doc_tokens")
    else:
        sums, sizes = result.get("doc_losses"), result.get("doc_bytes")
        sums = None if sums is None else [s / math.log(2) for s in sums]
    if sums is None or sizes is None or len(sizes) < 2:
        return None
    return sums, sizes


def val_figure(result: dict[str, Any], unit: str) -> Figure | None:
    """The val loss (or bits per byte) with its cluster-robust t interval over documents."""
    value = result.get("value" if unit == "loss" else "bits_per_byte")
    if value is None:
        return None
    docs = doc_values(result, unit)
    if docs is None:
        return Figure(value)
    _, se, dof = stats.cluster_mean(*docs)
    half = stats.t_quantile(dof) * se
    return Figure(value, value - half, value + half)


def val_difference(
    tuned: dict[str, Any], base: dict[str, Any], unit: str, what: str = "documents"
) -> Difference | None:
    """The val loss (bits per byte) difference over the documents (held-out conversations, for
    the conversation loss) both scored."""
    key = "value" if unit == "loss" else "bits_per_byte"
    if tuned.get(key) is None or base.get(key) is None:
        return None
    diff = tuned[key] - base[key]
    problem = unpaired(tuned, base)
    a, b = doc_values(tuned, unit), doc_values(base, unit)
    if problem or a is None or b is None or a[1] != b[1]:
        why = problem or "no bytes a document: data tokenized before its byte table"
        return Difference(diff, None, None, None, "not paired", why)
    diff, low, high, docs = stats.cluster_difference(a[0], b[0], a[1])
    return Difference(diff, low, high, None, f"{docs:,} {what}")


def item_difference(tuned: Score | None, base: Score | None, names: tuple[str, str], test):
    """The difference on the items both scored, by id (`test`: mcnemar or paired_t)."""
    if tuned is None or base is None:
        return None
    paired, note = paired_scores(base, tuned, names[1], names[0], test)
    if paired is None:
        return Difference(tuned.value - base.value, None, None, None, "not paired", note)
    assert base.correct is not None and tuned.correct is not None
    both = len(base.correct.keys() & tuned.correct.keys())
    return Difference(paired.diff, paired.low, paired.high, paired.p, f"{both:,} items", note)


def metrics(runs: list[Run]) -> list[Metric]:
    """The columns: the fixed ones, each gold-bpb task and generative evaluation any of `runs`
    has (a column a metric: never two units in one)."""
    gold = {k for r in runs for k in gold_scores(r)}
    out = list(FIXED)
    for task, label in GOLD_BPB_LABELS.items():
        if f"gold_bpb/{task}" in gold:
            out.append(Metric(f"gold_bpb/{task}", f"{label} gold-answer bits per byte", "bpb"))
    return out + [m for m in GENERATIVE if any(m.key in r.evals for r in runs)]


def figures(run: Run, columns: list[Metric]) -> dict[str, Figure | None]:
    """The run's figure in each column, with its interval."""
    scores = task_scores(run) | gold_scores(run)
    val = run.evals.get("val_loss") or {}
    out: dict[str, Figure | None] = {}
    for m in columns:
        if m.key in ("val_loss", "val_bpb"):
            out[m.key] = val_figure(val, m.unit)
        elif m.key == "sft_loss":  # a mean over conversations' tokens, as the val loss's
            out[m.key] = val_figure(run.evals.get("sft_loss") or {}, "loss")
        else:
            score = scores.get(m.key)
            fig = accuracy if m.unit == "pct" else mean_over_items
            out[m.key] = None if score is None else fig(score)
    return out


def differences(tuned: Run, base: Run, columns: list[Metric]) -> dict[str, Difference | None]:
    """The fine-tune minus its base in each column, paired where both have what pairs."""
    mine, theirs = task_scores(tuned) | gold_scores(tuned), task_scores(base) | gold_scores(base)
    names = (tuned.name, base.name)
    out: dict[str, Difference | None] = {}
    for m in columns:
        if m.key == "sft_loss":  # over the held-out conversations both scored
            mine_sft, base_sft = tuned.evals.get("sft_loss", {}), base.evals.get("sft_loss", {})
            out[m.key] = val_difference(mine_sft, base_sft, "loss", "conversations")
        elif m.key in ("val_loss", "val_bpb"):
            mine_val, base_val = tuned.evals.get("val_loss", {}), base.evals.get("val_loss", {})
            out[m.key] = val_difference(mine_val, base_val, m.unit)
        else:
            test = paired_t if m.unit == "bpb" else mcnemar
            out[m.key] = item_difference(mine.get(m.key), theirs.get(m.key), names, test)
    return out


def replies(runs: list[Run]) -> list[dict[str, Any]]:
    """Each prompt any of `runs` answered, with each run's reply (None: not asked)."""
    answers = [r.evals.get("chat_samples", {}).get("samples", []) for r in runs]
    prompts = list(dict.fromkeys(s["prompt"] for samples in answers for s in samples))
    return [
        {
            "prompt": p,
            "replies": [next((s["reply"] for s in a if s["prompt"] == p), None) for a in answers],
        }
        for p in prompts
    ]


def chat_section(runs: list[Run]) -> list[dict[str, Any]]:
    """A block a fine-tuned run: its base (None where the report does not list it), the
    columns, each run's figures, the difference, the published chat figures, the replies."""
    blocks = []
    for tuned in (r for r in runs if r.fine_tuned):
        base = base_of(tuned, runs)
        pair = [r for r in (base, tuned) if r is not None]
        columns = metrics(pair)
        setting = tuned.settings.get("base") or {}
        blocks.append(
            {
                "name": tuned.name,
                "base": base.name if base else None,
                "base_setting": setting.get("run") or setting.get("hf"),
                "columns": columns,
                "runs": [{"name": r.name, "figures": figures(r, columns)} for r in pair],
                "difference": differences(tuned, base, columns) if base else None,
                "references": [
                    ref for ref in CHAT_REFERENCES if any(m.key in ref.figures for m in columns)
                ],
                "prompts": replies(pair),
                "names": [r.name for r in pair],
            }
        )
    return blocks
