"""The report's figures: matplotlib PNGs inlined as base64 `data:` URIs, no file beside the page."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on compute nodes; must precede the pyplot import
import matplotlib.pyplot as plt  # noqa: E402

from lmpipe import stats  # noqa: E402
from lmpipe.eval.suite.tasks import TASKS as SUITE_TASKS  # noqa: E402  a definition module
from lmpipe.report.references import references_with  # noqa: E402
from lmpipe.report.runs import Run, tokens_name, tokens_of  # noqa: E402


def _png(fig: plt.Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _colors(runs: list[Run]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {r.name: cycle[i % len(cycle)] for i, r in enumerate(runs)}


def _reference_lines(ax: plt.Axes, refs: list[tuple[str, float]]) -> None:
    """Published figures as grey dashed lines, named in the legend (labels on the axis overlap)."""
    styles = ["--", ":", "-.", (0, (5, 1)), (0, (1, 3)), (0, (3, 5, 1, 5))]
    for i, (label, y) in enumerate(refs):
        ax.axhline(y, ls=styles[i % len(styles)], lw=1.2, color="0.4", label=f"reference {label}")


def loss_panels(runs: list[Run]) -> dict[str, list[Run]]:
    """The runs with losses logged, by the dataset their losses are on and, where they differ,
    whose tokens (one panel each): a loss in nats a token of one tokenizer is not on the scale
    of another's, so no panel holds two."""
    panels: dict[tuple[str, str | None], list[Run]] = {}
    for r in runs:
        if r.train or r.val:
            panels.setdefault((r.train_data, tokens_of(r)), []).append(r)
    datasets = [dataset for dataset, _ in panels]
    return {
        dataset if datasets.count(dataset) == 1 else f"{dataset}, in {tokens_name(of)}": panel
        for (dataset, of), panel in panels.items()
    }


def _panel_figure(
    panels: dict[str, list[Run]], height: float, draw: Callable[[plt.Axes, str, list[Run]], None]
) -> str:
    """One panel a dataset, stacked, each drawn by `draw(ax, dataset, runs)`, its legend outside
    on the right: the frame the curves against tokens or wall time share."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, height * len(panels)), squeeze=False)
    for ax, (dataset, panel) in zip(axes[:, 0], panels.items(), strict=True):
        draw(ax, dataset, panel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return _png(fig)


def loss_figure(runs: list[Run]) -> str | None:
    """Train and val loss against tokens, one panel a dataset: pretraining text and chat data
    have losses of different scales, and one axis would flatten the pretraining curves."""
    panels = loss_panels(runs)
    if not panels:
        return None
    colors = _colors(runs)

    def draw(ax: plt.Axes, dataset: str, panel: list[Run]) -> None:
        for r in panel:
            if r.train:
                xs = [row["tokens"] for row in r.train]
                ys = [row["loss"] for row in r.train]
                ax.plot(xs, ys, color=colors[r.name], alpha=0.45, lw=1)
                ax.plot([], [], color=colors[r.name], label=f"{r.name} train")
            if r.val:
                xs = [row["tokens"] for row in r.val]
                ys = [row["val_loss"] for row in r.val]
                ax.plot(xs, ys, "o-", color=colors[r.name], ms=4, lw=2, label=f"{r.name} val")
        kind = "chat fine-tuning" if all(r.fine_tuned for r in panel) else "pretraining"
        if kind == "pretraining" and tokens_of(panel[0]) is None:  # the published FineWeb val
            refs = references_with("val_loss")  # losses, in GPT-2's tokens
            _reference_lines(
                ax, [(f"{r.name}: {r.figures['val_loss']}", r.figures["val_loss"]) for r in refs]
            )
        ax.set(
            xlabel="tokens trained",
            ylabel=f"loss (nats a token, {tokens_name(tokens_of(panel[0]))})",
            title=f"Train and val loss on {dataset} ({kind})",
        )

    return _panel_figure(panels, 4.4, draw)


def bpb_figure(runs: list[Run]) -> str | None:
    """Val loss in bits per byte against tokens trained, one panel a dataset, runs of every
    tokenizer on one axis (bits per byte is in none's units); None unless a pretraining run
    logged it (data tokenized with its byte table)."""
    panels: dict[str, list[Run]] = {}
    for r in runs:
        if not r.fine_tuned and any(row.get("val_bpb") is not None for row in r.val):
            panels.setdefault(r.train_data, []).append(r)
    if not panels:
        return None
    colors = _colors(runs)

    def draw(ax: plt.Axes, dataset: str, panel: list[Run]) -> None:
        for r in panel:
            rows = [row for row in r.val if row.get("val_bpb") is not None]
            label = f"{r.name} val" + (f" ({tokens_name(tokens_of(r))})" if tokens_of(r) else "")
            ax.plot([row["tokens"] for row in rows], [row["val_bpb"] for row in rows], "o-",
                    color=colors[r.name], ms=4, lw=2, label=label)  # fmt: skip
        units = {tokens_of(r) for r in panel}
        xlabel = "tokens trained" + (" (each run's own tokens)" if len(units) > 1 else "")
        ax.set(xlabel=xlabel, ylabel="val loss (bits a byte of text)",
               title=f"Val bits per byte on {dataset}")  # fmt: skip

    return _panel_figure(panels, 3.8, draw)


def wall_figure(runs: list[Run]) -> str | None:
    """Val loss against the trainer's wall time (evaluations during training included), one panel
    a dataset: two recipes that differ in step cost compare here, not against tokens. None
    unless two or more runs logged val losses with their wall time."""
    panels = {
        dataset: [r for r in panel if r.val and "wall_s" in r.val[-1]]
        for dataset, panel in loss_panels(runs).items()
    }
    panels = {dataset: panel for dataset, panel in panels.items() if len(panel) > 1}
    if not panels:
        return None
    colors = _colors(runs)

    def draw(ax: plt.Axes, dataset: str, panel: list[Run]) -> None:
        for r in panel:
            rows = [row for row in r.val if "wall_s" in row]
            ax.plot([row["wall_s"] for row in rows], [row["val_loss"] for row in rows], "o-",
                    color=colors[r.name], ms=4, lw=2, label=f"{r.name} val")  # fmt: skip
        ax.set(xlabel="wall time of training (s)", ylabel="val loss (nats a token)",
               title=f"Val loss against wall time on {dataset}")  # fmt: skip

    return _panel_figure(panels, 3.8, draw)


def lr_figure(runs: list[Run]) -> str | None:
    runs = [r for r in runs if any("lr" in row for row in r.train)]
    if not runs:
        return None
    colors = _colors(runs)
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for r in runs:
        rows = [row for row in r.train if "lr" in row]
        ax.plot(
            [x["step"] for x in rows], [x["lr"] for x in rows], color=colors[r.name], label=r.name
        )
    ax.set(xlabel="step", ylabel="learning rate", title="Learning rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def throughput_figure(runs: list[Run]) -> str | None:
    runs = [r for r in runs if r.train]
    if not runs:
        return None
    colors = _colors(runs)
    fig, (ax_tps, ax_mfu) = plt.subplots(1, 2, figsize=(10, 3.4))
    for r in runs:
        for ax, key, scale in ((ax_tps, "tokens_per_s", 1.0), (ax_mfu, "mfu", 100.0)):
            rows = [row for row in r.train if isinstance(row.get(key), int | float)]
            ys = [row[key] * scale for row in rows]
            ax.plot([row["step"] for row in rows], ys, color=colors[r.name], label=r.name, lw=1)
    ax_tps.set(xlabel="step", ylabel="tokens/s", title="Throughput")
    ax_mfu.set(xlabel="step", ylabel="MFU (%)", title="Model FLOPs utilisation")
    for ax in (ax_tps, ax_mfu):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _png(fig)


# the references of HellaSwag during training: models of the size the GPU recipes train
HELLASWAG_REFERENCES = ("OpenAI GPT-2 124M", "GPT-3 Small (125M)")


def wilson_interval(accuracy: float, items: int) -> tuple[float, float]:
    """The 95% Wilson score interval of an accuracy on `items` items (lmpipe.stats.wilson, the
    chat section's too): unlike the normal approximation it stays inside [0, 1] and keeps its
    width at 0% and 100%, where the tens of items of a CPU run often land."""
    return stats.wilson(round(accuracy * items), items)


WILSON_LABEL = "shaded: 95% Wilson interval"


def _accuracy_curve(
    ax: plt.Axes, name: str, color: str, rows: list[dict[str, Any]], key: str, items_key: str
) -> None:
    """An accuracy measured during training against tokens, with its 95% Wilson band where
    every line says how many items it scored (the legend says what the band is)."""
    xs, ys = [row["tokens"] for row in rows], [row[key] for row in rows]
    items = [row.get(items_key) for row in rows]
    label = name + (f" ({items[-1]:,} items)" if items[-1] else "")
    ax.plot(xs, ys, "o-", color=color, ms=3, label=label)
    if all(items):
        lo, hi = zip(*(wilson_interval(y, n) for y, n in zip(ys, items, strict=True)), strict=True)
        ax.fill_between(xs, lo, hi, color=color, alpha=0.12, lw=0)


def _band_legend(ax: plt.Axes) -> None:
    """A legend entry that names the shaded bands, where there are any."""
    if ax.collections:
        ax.fill_between([], [], [], color="0.5", alpha=0.25, lw=0, label=WILSON_LABEL)


def hellaswag_references() -> list[tuple[str, float]]:
    """(label, acc_norm) of HELLASWAG_REFERENCES, from lmpipe.report.references."""
    refs = [r for r in references_with("hellaswag") if r.name in HELLASWAG_REFERENCES]
    return [(f"{r.name}: {r.figures['hellaswag']:.1%}", r.figures["hellaswag"]) for r in refs]


def hellaswag_figure(runs: list[Run]) -> str | None:
    """HellaSwag acc_norm measured during training (eval.hellaswag.during_training) against
    tokens, a line a run that has any, with GPT-2 124M's and GPT-3 Small's; None (no figure)
    when no run has. A band: the 95% Wilson interval of a score on so few items, which on the
    CPU demo's tens of items is wider than anything the tiny models learn."""
    runs = [r for r in runs if r.hellaswag_curve]
    if not runs:
        return None
    colors = _colors(runs)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for r in runs:
        rows = r.hellaswag_curve
        _accuracy_curve(ax, r.name, colors[r.name], rows, "hellaswag", "hellaswag_items")
    _reference_lines(ax, hellaswag_references())
    ax.axhline(0.25, color="0.75", lw=3, label="chance (four endings)")
    _band_legend(ax)
    ax.set(xlabel="tokens trained", ylabel="HellaSwag acc_norm", title="HellaSwag during training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


# the references of the suite tasks during training: the same-size models of lm-eval's table
SUITE_REFERENCES = ("OPT-125M (lm-eval)", "OPT-350M (lm-eval)")


def suite_references(task: str) -> list[tuple[str, float]]:
    """(label, figure) of SUITE_REFERENCES that publish `task` (lmpipe.report.references, key
    `suite/<task>`: the task's headline metric), a split other than the runs' named."""
    out = []
    for r in references_with(f"suite/{task}"):
        if r.name in SUITE_REFERENCES:
            split = f", {r.splits[task]} split" if task in r.splits else ""
            out.append(
                (f"{r.name}: {r.figures[f'suite/{task}']:.1%}{split}", r.figures[f"suite/{task}"])
            )
    return out


def suite_tasks_logged(runs: list[Run]) -> list[str]:
    """The suite tasks any run scored during training (its during_training), registry order."""
    logged = {key[len("suite/") :] for r in runs for row in r.suite_curve for key in row}
    return [t for t in SUITE_TASKS if t in logged]


def _headline(runs: list[Run], task: str) -> str:
    """A task's metric as the runs' suite result files name it (acc_norm where lm-eval's task
    has it, else acc), read there: the report knows no task definitions."""
    for r in runs:
        headline = (r.evals.get("suite") or {}).get("tasks", {}).get(task, {}).get("headline")
        if headline:
            return headline
    return "acc_norm, else acc"


def suite_figure(runs: list[Run]) -> str | None:
    """The suite tasks scored during training (eval.suite.during_training) against tokens, one
    panel a task, a line a run that scored it, as the HellaSwag figure (the 95% Wilson band of
    so few items), with OPT-125M's and OPT-350M's published figures where lm-eval's table has
    the task and the chance level (one over the choices); None when no run scored any."""
    tasks = suite_tasks_logged(runs)
    if not tasks:
        return None
    colors = _colors([r for r in runs if r.suite_curve])
    cols = min(2, len(tasks))
    rows_ = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(7 * cols, 3.4 * rows_), squeeze=False)
    for ax in axes.flat[len(tasks) :]:
        ax.set_visible(False)
    for ax, task in zip(axes.flat, tasks, strict=False):
        key = f"suite/{task}"
        for r in runs:
            rows = [row for row in r.suite_curve if key in row]
            if not rows:
                continue
            _accuracy_curve(ax, r.name, colors[r.name], rows, key, f"{key}_items")
        _reference_lines(ax, suite_references(task))
        choices = SUITE_TASKS[task].choices
        ax.axhline(1 / choices, color="0.75", lw=3, label=f"chance ({choices} choices)")
        _band_legend(ax)
        ax.set(
            xlabel="tokens trained", ylabel=_headline(runs, task), title=f"{task} during training"
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return _png(fig)
