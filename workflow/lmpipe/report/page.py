"""The report stage: one self-contained HTML file that compares the runs a report names.

    python -m lmpipe.report --config-json J --results results --data results/data \\
        --out results/report_embedded.html

where J is `lmpipe.config.report_params(config, report)`: `{"report", "gpu_hour_price", "order",
"runs": {run: {"dataset", "model", "train", "launch", "eval", "evaluations", ...}}}`. It reads
only the files the other stages write (lmpipe.report.runs); whatever is missing is reported, not
fatal, so the same page is also a progress report while training runs (lmpipe.report.progress
builds it from a config file, by hand).

Figures are inline PNGs (lmpipe.report.figures); the page has no script and no external link,
so it opens offline from a mail attachment or a cluster's scratch folder.
"""

from __future__ import annotations

import argparse
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2

from lmpipe.costs import gpu_hour_price
from lmpipe.files import write_text_atomic
from lmpipe.job_params import PREFIX
from lmpipe.paths import REPORT_TEMPLATES, Layout
from lmpipe.report.chat import chat_section
from lmpipe.report.comparison import compare
from lmpipe.report.compression import compression_rows, task_compression
from lmpipe.report.figures import (
    bpb_figure,
    hellaswag_figure,
    loss_figure,
    lr_figure,
    suite_figure,
    throughput_figure,
    wall_figure,
)
from lmpipe.report.findings import findings
from lmpipe.report.noise import task_noise, undecided_words
from lmpipe.report.references import REFERENCES
from lmpipe.report.runs import (
    Run,
    flatten,
    headline,
    headline_columns,
    load_run,
    produced_by,
    recipe_headlines,
    unit_columns,
    used_settings,
)
from lmpipe.report.sweep import fmt_sci, sweep_context

# ----------------------------------------------------------------------------------------------
# settings side by side


def _setting(value: Any) -> str:
    """A setting as people write it: 1e+12 rather than 1000000000000.0, never rounded."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return value if isinstance(value, str) else json.dumps(value)


def _disagree(values: list[Any], group: list[int]) -> bool:
    """Whether the runs at positions `group` have different values."""
    return len({json.dumps(values[i], sort_keys=True) for i in group}) > 1


def settings_table(runs: list[Run]) -> list[dict[str, Any]]:
    """One row a setting: its value in each run, and how the runs differ in it.

    `differs`: runs of the same kind (pretraining, fine-tuning) disagree: a deliberate
    difference, what the report compares. `kind`: only runs of different kinds disagree (a
    fine-tuning run has its own data, steps and lr): what kind of run it is, not a comparison.
    """
    flat = [flatten(used_settings(r)) for r in runs]
    keys = sorted(set().union(*flat))
    kinds = {r.kind for r in runs}
    rows = []
    for key in keys:
        values = [f.get(key, "—") for f in flat]
        within = any(
            _disagree(values, [i for i, r in enumerate(runs) if r.kind == k]) for k in kinds
        )
        rows.append(
            {
                "key": key,
                "values": [_setting(v) for v in values],
                "differs": within,
                "kind": not within and _disagree(values, list(range(len(runs)))),
            }
        )
    return rows


# ----------------------------------------------------------------------------------------------
# formatting (jinja2 filters)


def fmt_num(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:,.{digits}f}"


def fmt_pct(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}%"


def fmt_tokens(x: float | None) -> str:
    if x is None:
        return "—"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= size:
            return f"{x / size:.3g}{unit}"
    return str(int(x))


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def fmt_metric(x: float | None, fmt: str) -> str:
    """A headline figure in its column's format (lmpipe.registry.Column.fmt)."""
    return fmt_pct(x) if fmt == "pct" else fmt_num(x, 4)


# ----------------------------------------------------------------------------------------------
# the page


def plan_rows(runs: list[Run], headlines: list[dict[str, Any]], plan: dict[str, Any]):
    """Each run's estimate (lmpipe.plan) beside what it measured."""
    rows = []
    for run, h in zip(runs, headlines, strict=True):
        estimate = plan.get(run.name)
        if estimate is None:
            continue
        measured = {k: h[k] for k in ("wall_s", "gpu_hours", "cost", "status")}
        rows.append({"name": run.name, "plan": estimate} | measured)
    return rows


def source_rows(runs: list[Run]) -> list[dict[str, Any]]:
    """Where a report has a mixture: each run's data by source, its weight, the tokens (and
    epochs) the training drew from it (the last train line of metrics.jsonl) and the val loss on
    its own val shard (the val_loss evaluation); a run of one dataset is one row."""
    if not any(r.evals.get("val_loss", {}).get("sources") for r in runs):
        return []
    rows = []
    for run in runs:
        last = run.train[-1] if run.train else {}
        val = run.evals.get("val_loss", {})
        by_source = val.get("sources") or {val.get("dataset", "?"): val | {"weight": 1.0}}
        for name, result in by_source.items():
            tokens = last.get("tokens_by_source", {}).get(name, last.get("tokens"))
            epochs = last.get("epochs_by_source", {}).get(name)
            rows.append(
                {
                    "run": run.name, "source": name, "weight": result.get("weight"),
                    "tokens": tokens, "epochs": epochs, "val_loss": result.get("value"),
                    "stderr": result.get("stderr"), "val_tokens": result.get("tokens"),
                }
            )  # fmt: skip
        if val.get("sources"):
            rows.append(
                {
                    "run": run.name, "source": "the mixture (weighted mean)", "weight": 1.0,
                    "tokens": last.get("tokens"), "epochs": None, "val_loss": val.get("value"),
                    "stderr": val.get("stderr"), "val_tokens": val.get("tokens"),
                }
            )  # fmt: skip
    return rows


def restart_rows(runs: list[Run]) -> list[dict[str, Any]]:
    """One row a run with attempts.jsonl: what it survived (lmpipe.report.restarts)."""
    rows = []
    for run in runs:
        s = run.restarts
        if s is None:
            continue
        ids = s.job_ids  # None: that attempt ran outside SLURM
        job_ids = ", ".join(i or "—" for i in ids) if any(ids) else "— (not under SLURM)"
        each = []
        for r in s.restarts:
            why = f" {r.why}" if r.why else ""
            reached = f"{r.reached}{'+' if r.at_least else ''}"
            lost = "time lost unknown" if r.lost_s is None else f"{fmt_duration(r.lost_s)} lost"
            each.append(
                f"attempt {r.after}: {r.cause}{why} at step {reached}, resumed from"
                f" {r.resumed_step}: {r.steps_redone} step(s) redone, {lost}"
            )
        each += [str(k) for k in s.skipped]
        rows.append(
            {
                "name": run.name,
                "attempts": len(s.attempts),
                "clean": s.clean,
                "last": s.last,
                "causes": ", ".join(f"{n} {cause}" for cause, n in s.by_cause.items()),
                "steps_redone": f"{'≥ ' if s.at_least else ''}{s.steps_redone:,}",
                "lost_s": s.lost_s,
                "lost_unknown": s.lost_unknown,
                "job_ids": job_ids,
                "each": each,
                "reruns": s.reruns,
                "earlier": s.earlier,
            }
        )
    return rows


def environment() -> jinja2.Environment:
    """The templates of workflow/report/ with the report's number formats as filters."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(REPORT_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters |= {
        "num": fmt_num,
        "pct": fmt_pct,
        "metric": fmt_metric,
        "tokens": fmt_tokens,
        "duration": fmt_duration,
        "sci": fmt_sci,
        "produced_by": produced_by,
    }
    return env


def price_label(setting: float | dict[str, float]) -> str:
    """The price the costs were computed at, in words: "$2.00 a GPU-hour", or one a type."""
    if isinstance(setting, int | float):
        return f"${setting:,.2f} a GPU-hour"
    return ", ".join(f"${p:,.2f} an {gpu}-hour" for gpu, p in setting.items())


def cpu_trained(runs: list[Run]) -> list[str]:
    """The runs trained on CPU cores (a reference run trained on none)."""
    return [
        r.name
        for r in runs
        if r.settings.get("launch", {}).get("device") == "cpu" and not r.reference
    ]


def headline_references(runs: list[Run]) -> list[Any]:
    """The headline's references: those with a figure of its columns or a training budget."""
    columns = unit_columns(runs, headline_columns(runs))
    return [r for r in REFERENCES if r.tokens or any(c.key in r.figures for c in columns)]


def task_comparison(runs: list[Run], pairs: list[list[str]] | None) -> dict[str, Any] | None:
    """The task table and its verdicts (lmpipe.report.comparison), with which task can tell
    these runs apart (lmpipe.report.noise), said before its numbers."""
    comparison = compare(runs, pairs)
    if comparison is not None:
        comparison["noise"] = task_noise(runs, comparison["rows"])
        comparison["undecided"] = undecided_words(comparison["noise"])
    return comparison


def build_report(params: dict[str, Any], layout: Layout, plan: dict[str, Any] | None = None) -> str:
    """The HTML of the report described by `params` (report_params JSON), from `layout`'s files,
    with `plan` (lmpipe.plan.report_plan) beside the measured figures."""
    for key in ("report", "runs"):
        if key not in params:
            raise ValueError(f"--config-json: missing key {key!r} (expected report_params JSON)")
    setting = params.get("gpu_hour_price", 0.0)
    order = params.get("order", list(params["runs"]))
    runs = [load_run(layout, name, params["runs"][name]) for name in order]
    # each run's price: the report's one figure, or its GPU type's (the plan names the type)
    gpu = {r.name: ((plan or {}).get(r.name) or {}).get("gpu") or "" for r in runs}
    price = {r.name: gpu_hour_price(setting, gpu[r.name]) for r in runs}
    env = environment()
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    if "sweep" in params:  # a sweep's report (lmpipe.sweeps): its points by what they sweep
        return env.get_template("sweep.html.j2").render(
            generated=generated,
            runs=runs,
            headlines=[headline(r, price[r.name]) for r in runs],
            **sweep_context(params, runs),
        )
    figures = {
        "loss": loss_figure(runs),
        "bpb": bpb_figure(runs),
        "wall": wall_figure(runs),
        "lr": lr_figure(runs),
        "throughput": throughput_figure(runs),
        "hellaswag": hellaswag_figure(runs),
        "suite": suite_figure(runs),
    }
    settings = settings_table(runs)
    kinds: dict[str, list[str]] = {}
    for r in runs:
        kinds.setdefault(r.kind, []).append(r.name)
    headlines = [headline(r, price[r.name]) for r in runs]
    val_rows = compression_rows(runs, layout)
    return env.get_template("report.html.j2").render(
        recipes=recipe_headlines(runs, headlines),
        report=params["report"],
        generated=generated,
        price_label=price_label(setting),
        findings=findings(runs, params.get("compare")),
        runs=runs,
        columns=unit_columns(runs, headline_columns(runs)),
        headlines=headlines,
        plan=plan_rows(runs, headlines, plan or {}),
        restarts=restart_rows(runs),
        sources=source_rows(runs),
        compression=val_rows,
        task_compression=task_compression(runs, layout, val_rows),
        references=headline_references(runs),
        comparison=task_comparison(runs, params.get("compare")),
        settings=settings,
        differing=[row["key"] for row in settings if row["differs"]],
        kind_differing=[row["key"] for row in settings if row["kind"]],
        kinds=kinds,
        cpu_runs=cpu_trained(runs),
        figures=figures,
        chat=chat_section(runs),
    )


def write_report(
    params: dict[str, Any], layout: Layout, out: str | Path, plan: dict[str, Any] | None = None
) -> None:
    out = Path(out)
    write_text_atomic(out, build_report(params, layout, plan))  # never a half-written report
    print(f"report: {out.resolve()}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
        fromfile_prefix_chars=PREFIX,  # --config-json @FILE (lmpipe.job_params)
    )
    p.add_argument(
        "--config-json", required=True, help="report_params JSON, or @FILE holding it (the rule's)"
    )
    p.add_argument(
        "--plan-json", help="lmpipe.plan.report_plan JSON (or @FILE): estimates beside the runs"
    )
    p.add_argument("--results", default="results", help="results folder")
    p.add_argument("--data", default="results/data", help="tokenized data folder")
    p.add_argument("--out", required=True, help="the HTML file to write")
    args = p.parse_args(argv)
    plan = json.loads(args.plan_json) if args.plan_json else None
    write_report(json.loads(args.config_json), Layout(args.results, args.data), args.out, plan)
