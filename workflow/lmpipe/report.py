"""The report stage: one self-contained HTML file that compares the runs a report names.

What workflow/rules/report.smk runs:

    python -m lmpipe.report --config-json J --results results --data results/data \\
        --out results/report_embedded.html

where J is `lmpipe.config.report_params(config, report)`: `{"report", "gpu_hour_price",
"runs": {run: {"dataset", "model", "train", "launch", "eval", ...}}}`.

It reads, for each run, only files the other stages write (never logs):
`runs/{run}/train/metrics.jsonl`, `train/provenance.json`, `train/final/meta.json`,
`runs/{run}/eval/*.json`, and the dataset's `tokens/manifest.json`. Whatever is missing is reported,
not fatal: a run without `final/meta.json` or an expected eval file is shown as "not finished" with
the metrics it has so far. So the same command is also a progress report while training runs; the
`--config` form builds J from a config file, e.g.

    python -m lmpipe.report --config config/config.yaml --report 124m --out progress_124m.html

Figures are matplotlib PNGs inlined as base64 `data:` URIs; the page has no script and no external
link, so it opens offline from a mail attachment or a cluster's scratch folder.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import matplotlib

matplotlib.use("Agg")  # no display on compute nodes; must precede the pyplot import
import matplotlib.pyplot as plt  # noqa: E402

from lmpipe.paths import REPORT_TEMPLATES, Layout  # noqa: E402
from lmpipe.references import REFERENCES, loss_references  # noqa: E402

EVAL_FILES = ("val_loss", "hellaswag", "hellaswag_lm_eval", "samples", "sft_loss", "chat_samples")


# ----------------------------------------------------------------------------------------------
# reading a run's files


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object, or None when the file does not exist (yet); bad JSON names the file."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_metrics(path: Path) -> dict[str, list[dict[str, Any]]]:
    """metrics.jsonl split into train, val and hellaswag lines, one per step, ordered by step.

    A resumed run logs again the steps after its last checkpoint: the later line wins. The last
    line may be half written while training runs, so it alone may be unreadable.
    """
    kinds: dict[str, dict[int, dict[str, Any]]] = {"train": {}, "val": {}, "hellaswag": {}}
    if not path.exists():
        return {k: [] for k in kinds}
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                break  # a line still being written
            raise ValueError(f"{path}:{i}: not valid JSON ({e})") from None
        if not isinstance(row, dict) or "step" not in row:
            raise ValueError(f"{path}:{i}: expected an object with a 'step', got {line[:80]!r}")
        if "val_loss" in row:
            kinds["val"][row["step"]] = row
        elif "hellaswag" in row:
            kinds["hellaswag"][row["step"]] = row
        elif "loss" in row:
            kinds["train"][row["step"]] = row
        else:
            raise ValueError(f"{path}:{i}: neither a train, val nor hellaswag line: {line[:80]!r}")
    return {k: [rows[s] for s in sorted(rows)] for k, rows in kinds.items()}


@dataclass
class Run:
    """Everything the report knows about one run; any file may be missing."""

    name: str
    settings: dict[str, Any]
    train: list[dict[str, Any]] = field(default_factory=list)
    val: list[dict[str, Any]] = field(default_factory=list)
    hellaswag_curve: list[dict[str, Any]] = field(default_factory=list)
    provenance: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    evals: dict[str, dict[str, Any]] = field(default_factory=dict)
    manifest: dict[str, Any] | None = None
    missing: list[str] = field(default_factory=list)

    @property
    def fine_tuned(self) -> bool:
        """A chat fine-tuning run: its train and val loss are on conversations, not FineWeb."""
        return "sft" in self.settings

    @property
    def finished(self) -> bool:
        return not self.missing

    @property
    def status(self) -> str:
        if self.finished:
            return "finished"
        if not self.train:
            return "not started"
        return "not finished"


def expected_eval_files(settings: dict[str, Any]) -> list[str]:
    """The eval files a finished run has; lm-eval only where the run's eval settings ask for it."""
    names = ["val_loss", "hellaswag", "samples"]
    if settings.get("eval", {}).get("lm_eval", False):
        names.append("hellaswag_lm_eval")
    if settings.get("chat_dataset"):  # a fine-tuned run or its base (lmpipe.sft_eval)
        names += ["sft_loss", "chat_samples"]
    return names


def load_run(layout: Layout, name: str, settings: dict[str, Any]) -> Run:
    train_dir = Path(layout.train_dir(name))
    metrics = read_metrics(Path(layout.metrics(name)))
    run = Run(name, settings, metrics["train"], metrics["val"], metrics["hellaswag"])
    run.provenance = read_json(train_dir / "provenance.json")
    run.meta = read_json(Path(layout.final_checkpoint(name)) / "meta.json")
    if run.meta is None:
        run.missing.append("train/final/meta.json")
    eval_dir = Path(layout.eval_dir(name))
    for metric in EVAL_FILES:
        data = read_json(eval_dir / f"{metric}.json")
        if data is not None:
            run.evals[metric] = data
    run.missing += [f"eval/{m}.json" for m in expected_eval_files(settings) if m not in run.evals]
    if "dataset" in settings:  # the text data (an SFT run's is its base's)
        dataset = settings.get("text_dataset") or settings["dataset"]
        run.manifest = read_json(Path(layout.tokens_manifest(dataset)))
    return run


# ----------------------------------------------------------------------------------------------
# the headline figures of a run


def _mean_after_first(rows: list[dict[str, Any]], key: str) -> float | None:
    """Mean of `key` over the train lines, leaving out the first (compile and warm-up)."""
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    if len(values) > 1:
        values = values[1:]
    return statistics.fmean(values) if values else None


def _acc_norm(result: dict[str, Any] | None) -> float | None:
    if result is None:
        return None
    return result.get("acc_norm", result.get("value"))


def headline(run: Run, gpu_hour_price: float) -> dict[str, Any]:
    """One row of the headline table. Falls back to training-time figures before the end."""
    meta = run.meta or {}
    last = run.train[-1] if run.train else {}
    val_loss = run.evals.get("val_loss", {}).get("value")
    val_loss_note = ""
    if val_loss is None and run.val and not run.fine_tuned:  # an SFT run's is on chat data
        val_loss, val_loss_note = run.val[-1]["val_loss"], "during training"
    wall_s = meta.get("wall_s", last.get("wall_s"))
    world_size = meta.get("world_size", (run.provenance or {}).get("world_size"))
    device = run.settings.get("launch", {}).get("device")
    gpu_hours = None  # CPU runs have none (not zero: the table says "CPU")
    if device == "cuda":
        gpu_hours = meta.get("gpu_hours")
        if gpu_hours is None and wall_s is not None and world_size:  # still training
            gpu_hours = wall_s * world_size / 3600
    lm_eval = run.evals.get("hellaswag_lm_eval")
    return {
        "name": run.name,
        "status": run.status,
        "missing": run.missing,
        "val_loss": val_loss,
        "val_loss_note": val_loss_note,
        "hellaswag": _acc_norm(run.evals.get("hellaswag")),
        "hellaswag_lm_eval": _acc_norm(lm_eval),
        "hellaswag_lm_eval_acc": None if lm_eval is None else lm_eval.get("acc"),
        "tokens": meta.get("tokens", last.get("tokens")),
        "step": meta.get("step", last.get("step")),
        "max_steps": run.settings.get("train", {}).get("max_steps"),
        "wall_s": wall_s,
        "gpu_hours": gpu_hours,
        "cost": None if gpu_hours is None else gpu_hours * gpu_hour_price,
        "tokens_per_s": _mean_after_first(run.train, "tokens_per_s"),
        "mfu": _mean_after_first(run.train, "mfu"),
        "device": device,
        "world_size": world_size,
    }


def chat_comparison(runs: list[Run]) -> dict[str, Any] | None:
    """Fine-tuned runs beside their bases: held-out conversation loss, evals, the same prompts."""
    chat_runs = [r for r in runs if "sft_loss" in r.evals or "chat_samples" in r.evals]
    if not chat_runs:
        return None
    rows = []
    for r in chat_runs:
        base = r.settings.get("base", {}).get("run") or r.settings.get("base", {}).get("hf")
        rows.append(
            {
                "name": r.name,
                "base": base,
                "sft_loss": r.evals.get("sft_loss", {}).get("value"),
                "val_loss": r.evals.get("val_loss", {}).get("value"),
                "hellaswag": _acc_norm(r.evals.get("hellaswag")),
            }
        )
    answers = {r.name: r.evals.get("chat_samples", {}).get("samples", []) for r in chat_runs}
    prompts = list(dict.fromkeys(s["prompt"] for samples in answers.values() for s in samples))
    table = [
        {
            "prompt": p,
            "replies": [
                next((s["reply"] for s in answers[r.name] if s["prompt"] == p), None)
                for r in chat_runs
            ],
        }
        for p in prompts
    ]
    return {"runs": [r.name for r in chat_runs], "rows": rows, "prompts": table}


def produced_by(result: dict[str, Any]) -> str:
    """What made an eval file, in one line: its scalar fields; nested ones (the checkpoint's
    meta.json) only by their step and settings hash, as the full settings are shown elsewhere."""
    parts = []
    for key, value in (result.get("produced_by") or {}).items():
        if isinstance(value, dict):
            short = {k: value[k] for k in ("step", "settings_hash") if k in value}
            parts += [f"{key}.{k}={v}" for k, v in short.items()]
        elif not isinstance(value, list):
            parts.append(f"{key}={value}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------------------------
# settings side by side


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1}} -> {"train.lr": 1}; lists stay values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= flatten(v, f"{key}.")
        else:
            out[key] = v
    return out


def _setting(value: Any) -> str:
    """A setting as people write it: 1e+12 rather than 1000000000000.0, never rounded."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return value if isinstance(value, str) else json.dumps(value)


def settings_table(runs: list[Run]) -> list[dict[str, Any]]:
    """One row a setting: its value in each run, and whether the runs disagree."""
    flat = [flatten({k: v for k, v in r.settings.items() if k != "run"}) for r in runs]
    keys = sorted(set().union(*flat))
    rows = []
    for key in keys:
        values = [f.get(key, "—") for f in flat]
        differs = len({json.dumps(v, sort_keys=True) for v in values}) > 1
        rows.append({"key": key, "values": [_setting(v) for v in values], "differs": differs})
    return rows


# ----------------------------------------------------------------------------------------------
# figures


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


def loss_figure(runs: list[Run]) -> str | None:
    if not any(r.train or r.val for r in runs):
        return None
    colors = _colors(runs)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for r in runs:
        data = " (chat data)" if r.fine_tuned else ""
        if r.train:
            xs = [row["tokens"] for row in r.train]
            ax.plot(xs, [row["loss"] for row in r.train], color=colors[r.name], alpha=0.45, lw=1)
            ax.plot([], [], color=colors[r.name], label=f"{r.name} train{data}")
        if r.val:
            xs = [row["tokens"] for row in r.val]
            ys = [row["val_loss"] for row in r.val]
            ax.plot(xs, ys, "o-", color=colors[r.name], ms=4, lw=2, label=f"{r.name} val{data}")
    _reference_lines(ax, [(f"{r.name}: {r.val_loss}", r.val_loss) for r in loss_references()])
    ax.set(xlabel="tokens trained", ylabel="loss (nats a token)", title="Train and val loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


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


def hellaswag_figure(runs: list[Run]) -> str | None:
    """HellaSwag measured during training; None (no plot) when no run measured it."""
    runs = [r for r in runs if r.hellaswag_curve]
    if not runs:
        return None
    colors = _colors(runs)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for r in runs:
        xs = [row["tokens"] for row in r.hellaswag_curve]
        ys = [row["hellaswag"] for row in r.hellaswag_curve]
        ax.plot(xs, ys, "o-", color=colors[r.name], ms=3, label=r.name)
    refs = [(f"{r.name}: {r.hellaswag:.1%}", r.hellaswag) for r in REFERENCES if r.hellaswag]
    _reference_lines(ax, refs)
    ax.axhline(0.25, color="0.75", lw=3, label="chance (four endings)")
    ax.set(xlabel="tokens trained", ylabel="HellaSwag acc_norm", title="HellaSwag during training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


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


# ----------------------------------------------------------------------------------------------
# the page


def build_report(params: dict[str, Any], layout: Layout) -> str:
    """The HTML of the report described by `params` (report_params JSON), from `layout`'s files."""
    for key in ("report", "runs"):
        if key not in params:
            raise ValueError(f"--config-json: missing key {key!r} (expected report_params JSON)")
    price = float(params.get("gpu_hour_price", 0.0))
    order = params.get("order", list(params["runs"]))
    runs = [load_run(layout, name, params["runs"][name]) for name in order]
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
        "tokens": fmt_tokens,
        "duration": fmt_duration,
        "produced_by": produced_by,
    }
    figures = {
        "loss": loss_figure(runs),
        "lr": lr_figure(runs),
        "throughput": throughput_figure(runs),
        "hellaswag": hellaswag_figure(runs),
    }
    settings = settings_table(runs)
    return env.get_template("report.html.j2").render(
        report=params["report"],
        generated=datetime.now(UTC).isoformat(timespec="seconds"),
        gpu_hour_price=price,
        runs=runs,
        headlines=[headline(r, price) for r in runs],
        references=REFERENCES,
        settings=settings,
        differing=[row["key"] for row in settings if row["differs"]],
        figures=figures,
        chat=chat_comparison(runs),
    )


def params_from_config(config_path: str, report: str) -> tuple[dict[str, Any], Layout]:
    """report_params and the layout from a config file: the by-hand (progress report) form."""
    from lmpipe import config as lmconfig

    config = lmconfig.load_config(config_path)
    if report not in config["reports"]:
        known = ", ".join(config["reports"])
        raise ValueError(f"{config_path}: no report {report!r} (reports: {known})")
    return json.loads(lmconfig.report_params(config, report)), lmconfig.layout(config)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config-json", help="report_params JSON (what the rule passes)")
    src.add_argument("--config", help="a config file; with --report, for a report by hand")
    p.add_argument("--report", help="the report's name in --config")
    p.add_argument("--results", help="results folder (default: the config's, or 'results')")
    p.add_argument("--data", help="tokenized data folder (default: the config's)")
    p.add_argument("--out", required=True, help="the HTML file to write")
    args = p.parse_args(argv)

    if args.config:
        if not args.report:
            p.error("--config needs --report")
        params, layout = params_from_config(args.config, args.report)
    else:
        params, layout = json.loads(args.config_json), Layout()
    layout = Layout(results=args.results or layout.results, data=args.data or layout.data)

    html = build_report(params, layout)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html)
    tmp.replace(out)  # never leave a half-written report behind
    print(f"report: {out.resolve()}")


if __name__ == "__main__":
    main()
