"""A sweep's report (`results/report_sweep-<name>.html`): its points compared by what they sweep.

From the report params' `sweep` section (lmpipe.sweeps.sweep_params) and the points' result
files: the final val loss and every headline evaluation against each swept key, one line per
value of the other keys, the best point marked (by val loss; by val bits per byte, a column of its
own, where the points read different tokenizers' tokens: a sweep of `tokenizer.vocab_size`);
every point's curves; and for a size ladder a
power law of val loss against training compute (lmpipe.report.powerlaw: its parameters with
standard errors, the range of exponents the points cannot tell apart, and a warning in words
where the law is not identified), and where the 124M / 350M presets would land on it beside
llm.c's published val losses. The ladder's points are one a model size under one rule, which
the page states: the setting every size shares, or each size's best of the settings every size
has. A point that did not finish is shown as such and left out of the best point and the fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmpipe.registry import EVALUATIONS, Column
from lmpipe.report.figures import _png, loss_figure, plt
from lmpipe.report.powerlaw import Fit, b_bounds, fit_power_law, range_words
from lmpipe.report.references import REFERENCES
from lmpipe.report.runs import BPB, Run, headline_columns, tokens_of
from lmpipe.sweeps import format_value

# what a sweep's best point is by: its final val loss, or, where its points read different
# tokenizers' tokens (a sweep of tokenizer.vocab_size), its val bits per byte
VAL_LOSS = Column("val_loss", "val loss", "value", "loss")
# what the ladder's parameter count N holds, on the figures and the page
PARAMETERS = "parameters, token embedding included"


def final_metrics(run: Run) -> dict[str, float | None]:
    """A point's headline figures from its eval files, by column key; none before it finished
    (a point still training is shown, never compared)."""
    return {
        column.key: run.evals.get(name, {}).get(column.field) if run.finished else None
        for name, evaluation in EVALUATIONS.items()
        for column in evaluation.columns
    }


def best_point(runs: list[Run], loss: dict[str, float | None]) -> str | None:
    """The finished point with the lowest final val loss (or the figure given)."""
    done = [r.name for r in runs if loss.get(r.name) is not None]
    return min(done, key=lambda n: loss[n]) if done else None


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def key_figure(
    key: str,
    short: dict[str, str],
    points: dict[str, dict[str, Any]],
    metrics: dict[str, dict[str, float | None]],
    columns: list[Column],
    best: str | None,
    x_of: dict[str, float] | None = None,
) -> str:
    """Each headline metric against swept `key`, one line per value of the other keys; `x_of`
    places a point on the x axis (a model's parameters) instead of its value."""
    others = [k for k in next(iter(points.values())) if k != key]
    lines: dict[tuple, list[str]] = {}
    for run, values in points.items():
        lines.setdefault(tuple(values[k] for k in others), []).append(run)
    xs_all = [x_of[r] if x_of else points[r][key] for r in points]
    numeric = _numeric(xs_all)
    categories = list(dict.fromkeys(xs_all)) if not numeric else []
    fig, axes = plt.subplots(1, len(columns), figsize=(5.2 * len(columns), 3.8), squeeze=False)
    for ax, column in zip(axes[0], columns, strict=True):
        for group, runs in lines.items():
            label = ", ".join(f"{short[k]}={v}" for k, v in zip(others, group, strict=True))
            pts = []
            for r in runs:
                x = x_of[r] if x_of else points[r][key]
                y = metrics[column.key].get(r)
                if y is not None:
                    pts.append((x if numeric else categories.index(x), y, r))
            pts.sort()
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label or "all")
            for x, y, r in pts:
                if r == best:
                    ax.plot(x, y, "*", ms=16, color="gold", mec="k", zorder=5)
        if numeric and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 5:
            ax.set_xscale("log")
        if categories:
            ax.set_xticks(range(len(categories)), [str(c) for c in categories])
        name = short[key]
        xlabel = f"{name} ({PARAMETERS})" if x_of else name
        ax.set(xlabel=xlabel, ylabel=column.label, title=f"{column.label} against {name}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


@dataclass
class Ladder:
    """The ladder's points under one rule, one a model size, and the points the rule leaves out."""

    points: list[dict[str, Any]]  # run, params, embedding, compute, loss; by compute
    rule: str  # the rule in words: "sizes compared at lr 3e-3"
    left_out: dict[str, str]  # run -> why the fit leaves it out
    no_rule: str | None = None  # why no rule compares the sizes (no setting they all share)


def setting_of(sweep: dict[str, Any], run: str) -> tuple:
    """A point's values of the swept keys other than the model: what its size is compared at."""
    return tuple(v for k, v in sweep["points"][run].items() if k != "model")


def setting_words(sweep: dict[str, Any], setting: tuple) -> str:
    """`lr 3e-3`: a setting as the page names it."""
    keys = [k for k in sweep["keys"] if k != "model"]
    return ", ".join(
        f"{sweep['short'][k]} {format_value(v)}" for k, v in zip(keys, setting, strict=True)
    )


def shared_settings(sweep: dict[str, Any], sizes: dict[str, int]) -> list[tuple]:
    """The settings every model size (a parameter count) has a point at, in the sweep's order."""
    by_size: dict[int, set[tuple]] = {}
    for run, n in sizes.items():
        by_size.setdefault(n, set()).add(setting_of(sweep, run))
    order = dict.fromkeys(setting_of(sweep, run) for run in sizes)
    return [s for s in order if all(s in settings for settings in by_size.values())]


def rule_words(sweep: dict[str, Any], shared: list[tuple]) -> str:
    """The ladder's rule in words."""
    if shared == [()]:
        return "one point a model size"
    if len(shared) == 1:
        return f"sizes compared at {setting_words(sweep, shared[0])}"
    each = "; ".join(setting_words(sweep, s) for s in shared)
    return f"each size at its best of {each} (every size has a point at each)"


def size_point(
    sweep: dict[str, Any], chosen: list[str], loss: dict[str, float | None], left_out: dict
) -> str | None:
    """A size's point among its points at the shared settings (`chosen`): the lowest loss once
    all have finished (a best of some would favour the size with fewer done); the others go to
    `left_out`, saying why."""
    if any(loss.get(r) is None for r in chosen):
        for r in chosen:
            left_out[r] = "not finished" if loss.get(r) is None else "its size has points to come"
        return None
    best = min(chosen, key=lambda r: loss[r])
    for r in chosen:
        if r != best:
            left_out[r] = f"its size's best is {setting_words(sweep, setting_of(sweep, best))}"
    return best


def ladder_points(sweep: dict[str, Any], runs: list[str], loss: dict[str, float | None]) -> Ladder:
    """One point a model size under one rule: the setting (the values of the swept keys besides
    the model) every size shares, or with several shared, each size's best of them, once all of
    a size's points at them have finished. Sizes compared at different settings (the best lr of
    a size that swept lr beside a single lr of the others) would fit the law to the lr sweep."""
    ladder = sweep["ladder"]
    sizes = {r: ladder["params"][r] for r in runs}
    shared = shared_settings(sweep, sizes)
    if not shared:
        keys = ", ".join(k for k in sweep["keys"] if k != "model")
        why = f"no value of {keys} that every model size has a point at"
        return Ladder([], "", {r: why for r in sizes}, no_rule=why)
    points, left_out = [], {}
    for n in sorted(set(sizes.values())):
        of_size = [r for r in sizes if sizes[r] == n]
        for r in of_size:
            if setting_of(sweep, r) not in shared:
                left_out[r] = f"{setting_words(sweep, setting_of(sweep, r))}: not every size has it"
        best = size_point(sweep, [r for r in of_size if r not in left_out], loss, left_out)
        if best is not None:
            points.append(
                {
                    "run": best,
                    "params": n,
                    "embedding": ladder["embedding"][best],
                    "compute": ladder["compute"][best],
                    "loss": loss[best],
                }
            )
    points.sort(key=lambda p: p["compute"])
    return Ladder(points, rule_words(sweep, shared), left_out)


def presets(ladder: dict[str, Any], fit: Fit | None) -> list[dict[str, Any]]:
    """The presets' compute, the fit's val loss there (and its range over the exponents as good
    as the best), and llm.c's published val loss."""
    published = {r.name: r.figures.get("val_loss") for r in REFERENCES}
    return [
        p
        | {
            "predicted": float(fit.loss(p["compute"])) if fit else None,
            "range": fit.profile.loss_range(p["compute"]) if fit else None,
            "published": published.get(p["reference"]),
        }
        for p in ladder["presets"]
    ]


def ladder_figure(fit: Fit | None, points: list[dict[str, Any]], marks: list[dict]) -> str:
    """Val loss against compute, log-log: the points, the fit out to the presets with the band of
    the laws as good as it, their marks."""
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.plot([p["compute"] for p in points], [p["loss"] for p in points], "o", ms=8, label="points")
    for i, p in enumerate(points):  # labels above and below by turns: neighbours lie close
        ax.annotate(p["run"].split("/", 1)[-1], (p["compute"], p["loss"]), fontsize=7,
                    xytext=(4, 4 if i % 2 == 0 else -11), textcoords="offset points")  # fmt: skip
    if fit is not None:
        fit_curve(ax, fit, points, marks)
    published = [m for m in marks if m["published"] is not None]
    for i, m in enumerate(published):
        ax.plot(m["compute"], m["published"], "*", ms=12, color="0.3",
                label=None if i else "llm.c's published val loss")  # fmt: skip
        ax.annotate(f"{m['published']}", (m["compute"], m["published"]), fontsize=8,
                    xytext=(0, -14), textcoords="offset points", ha="center")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(xlabel=f"training compute C (FLOPs: 6N + 6LCT a token; N: {PARAMETERS})",
           ylabel="final val loss", title="Val loss against compute (size ladder)")  # fmt: skip
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def fit_curve(ax: Any, fit: Fit, points: list[dict[str, Any]], marks: list[dict]) -> None:
    """The fitted law, the band of the laws its points cannot tell from it, the presets on it."""
    hi = max([p["compute"] for p in points] + [m["compute"] for m in marks])
    # float: FLOPs in the params are ints, past int64 for the presets
    xs = np.geomspace(float(min(p["compute"] for p in points)), float(hi), 200)
    band = np.array([law.loss(xs) for law in fit.profile.laws])
    lo, up = b_bounds(fit.profile)
    ax.fill_between(xs, band.min(axis=0), band.max(axis=0), color="C1", alpha=0.15, lw=0,
                    label=f"as good a fit (95% profile): b from {lo} to {up}")  # fmt: skip
    status = "" if fit.identified else ", not identified"
    ax.plot(xs, fit.loss(xs), "-", color="C1", label=f"fit: b = {fit.b}{status}")
    # short labels, centred on their marks (the presets lie only ~10x apart in compute; the
    # table above the figure has the figures in full)
    for i, m in enumerate(marks):
        ax.plot(m["compute"], m["predicted"], "x", ms=10, mew=2, color="C3",
                label=None if i else "the presets on the fit")  # fmt: skip
        ax.annotate(f"{m['run']} {m['predicted']:.2f}", (m["compute"], m["predicted"]),
                    fontsize=8, xytext=(0, 9), textcoords="offset points", ha="center")  # fmt: skip


def sweep_context(params: dict[str, Any], runs: list[Run]) -> dict[str, Any]:
    """What the sweep template shows: the points' table, the figures, the fit."""
    sweep = params["sweep"]
    columns = headline_columns(runs)
    finals = {r.name: final_metrics(r) for r in runs}
    by = VAL_LOSS
    if len({tokens_of(r) for r in runs}) > 1:  # losses in different tokens: compare by bpb
        by = BPB
        columns = [BPB, *columns]
        for r in runs:
            finals[r.name][BPB.key] = r.evals.get("val_loss", {}).get(BPB.field)
    metrics = {c.key: {r.name: finals[r.name][c.key] for r in runs} for c in columns}
    loss = metrics["val_loss"]
    best = best_point(runs, metrics[by.key])
    ladder = sweep["ladder"]
    figures = {}
    for key in sweep["keys"]:
        x_of = ladder["params"] if ladder and key == "model" else None
        figures[key] = key_figure(
            key, sweep["short"], sweep["points"], metrics, columns, best, x_of
        )
    return {
        "sweep": sweep,
        "columns": columns,
        "metrics": metrics,
        "best": best,
        "by": by,
        "key_figures": figures,
        "curves": loss_figure(runs),
        "ladder": ladder_context(sweep, runs, loss) if ladder else None,
    }


def ladder_context(
    sweep: dict[str, Any], runs: list[Run], loss: dict[str, float | None]
) -> dict[str, Any]:
    """The ladder's section: its rule, points, the fit or why there is none, the presets."""
    ladder = sweep["ladder"]
    chosen = ladder_points(sweep, [r.name for r in runs], loss)
    result = fit_power_law(chosen.points) if chosen.no_rule is None else chosen.no_rule
    fit = result if isinstance(result, Fit) else None
    marks = presets(ladder, fit)
    return {
        "tokens_per_param": ladder["tokens_per_param"],
        "params": ladder["params"],
        "compute": ladder["compute"],
        "parameters": PARAMETERS,
        "rule": chosen.rule,
        "left_out": chosen.left_out,
        "points": chosen.points,
        "fit": fit,
        "no_fit": result if isinstance(result, str) else None,
        "profile_words": range_words(fit.profile) if fit else None,
        "presets": marks,
        "figure": ladder_figure(fit, chosen.points, marks) if chosen.points else None,
    }


def fmt_sci(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"
