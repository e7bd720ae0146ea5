"""A sweep's report (`results/report_sweep-<name>.html`): its points compared by what they sweep.

From the report params' `sweep` section (lmpipe.sweeps.sweep_params) and the points' result
files: the final val loss and every headline evaluation against each swept key, one line per
value of the other keys, the best point marked; every point's curves; and for a size ladder a
power law of val loss against training compute (lmpipe.report.powerlaw: its parameters with
standard errors, the range of exponents the points cannot tell apart, and a warning in words
where the law is not identified), and where the 124M / 350M presets would land on it beside
llm.c's published val losses. The fit takes the best finished point of each model size. A
point that did not finish is shown as such and left out of the best point and the fit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lmpipe.registry import EVALUATIONS, Column
from lmpipe.report.figures import _png, loss_figure, plt
from lmpipe.report.powerlaw import Fit, b_bounds, fit_power_law, range_words
from lmpipe.report.references import REFERENCES
from lmpipe.report.runs import Run, headline_columns

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
    """The finished point with the lowest final val loss."""
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


def ladder_points(ladder: dict[str, Any], runs: list[Run], loss: dict[str, float | None]):
    """The best finished point of each model size (its parameters), by compute."""
    best: dict[int, dict[str, Any]] = {}
    for r in runs:
        if loss.get(r.name) is None:
            continue
        n = ladder["params"][r.name]
        if n not in best or loss[r.name] < best[n]["loss"]:
            best[n] = {
                "run": r.name,
                "params": n,
                "embedding": ladder["embedding"][r.name],
                "compute": ladder["compute"][r.name],
                "loss": loss[r.name],
            }
    return sorted(best.values(), key=lambda p: p["compute"])


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
    metrics = {c.key: {r.name: finals[r.name][c.key] for r in runs} for c in columns}
    loss = metrics["val_loss"]
    best = best_point(runs, loss)
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
        "key_figures": figures,
        "curves": loss_figure(runs),
        "ladder": ladder_context(sweep, runs, loss) if ladder else None,
    }


def ladder_context(
    sweep: dict[str, Any], runs: list[Run], loss: dict[str, float | None]
) -> dict[str, Any]:
    """The ladder's section: its points, the fit or why there is none, the presets."""
    ladder = sweep["ladder"]
    points = ladder_points(ladder, runs, loss)
    result = fit_power_law(points)
    fit = result if isinstance(result, Fit) else None
    marks = presets(ladder, fit)
    return {
        "tokens_per_param": ladder["tokens_per_param"],
        "params": ladder["params"],
        "compute": ladder["compute"],
        "parameters": PARAMETERS,
        "points": points,
        "fit": fit,
        "no_fit": result if isinstance(result, str) else None,
        "profile_words": range_words(fit.profile) if fit else None,
        "presets": marks,
        "figure": ladder_figure(fit, points, marks) if points else None,
    }


def fmt_sci(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"
