"""What the report knows about a run: the files the other stages wrote, read leniently.

Only result files (never logs): `runs/{run}/train/metrics.jsonl`, `train/attempts.jsonl`,
`train/provenance.json`, `train/final/meta.json`, `runs/{run}/eval/*.json`, and the dataset's
`tokens/manifest.json`.
A missing file is reported, not fatal: the run is "not finished", with what it has so far.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmpipe import manifests
from lmpipe.files import read_json_lines
from lmpipe.paths import Layout
from lmpipe.registry import EVALUATIONS, Column
from lmpipe.replicas import recipe_of
from lmpipe.report.restarts import Restarts, read_attempts, summarise


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
    """metrics.jsonl split into train, val, hellaswag and suite (eval.suite.during_training: keys
    `suite/<task>`) lines, one per step, ordered by step.

    A resumed run logs again the steps after its last checkpoint: the later line wins. The last
    line may be half written while training runs, so it alone may be unreadable.
    """
    kinds: dict[str, dict[int, dict[str, Any]]] = {
        "train": {}, "val": {}, "hellaswag": {}, "suite": {},
    }  # fmt: skip
    if not path.exists():
        return {k: [] for k in kinds}
    for i, row in read_json_lines(path)[0]:
        if not isinstance(row, dict) or "step" not in row:
            raise ValueError(f"{path}:{i}: expected an object with a 'step', got {str(row)[:80]!r}")
        if "val_loss" in row:
            kinds["val"][row["step"]] = row
        elif "hellaswag" in row:
            kinds["hellaswag"][row["step"]] = row
        elif any(key.startswith("suite/") for key in row):
            kinds["suite"][row["step"]] = row
        elif "loss" in row:
            kinds["train"][row["step"]] = row
        else:
            raise ValueError(
                f"{path}:{i}: neither a train, val, hellaswag nor suite line: {str(row)[:80]!r}"
            )
    return {k: [rows[s] for s in sorted(rows)] for k, rows in kinds.items()}


@dataclass
class Run:
    """Everything the report knows about one run; any file may be missing."""

    name: str
    settings: dict[str, Any]
    train: list[dict[str, Any]] = field(default_factory=list)
    val: list[dict[str, Any]] = field(default_factory=list)
    hellaswag_curve: list[dict[str, Any]] = field(default_factory=list)
    suite_curve: list[dict[str, Any]] = field(default_factory=list)  # the suite during training
    provenance: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    evals: dict[str, dict[str, Any]] = field(default_factory=dict)
    manifest: dict[str, Any] | None = None
    restarts: Restarts | None = None  # None: no attempts.jsonl (not started, or trained before it)
    missing: list[str] = field(default_factory=list)

    @property
    def fine_tuned(self) -> bool:
        """A chat fine-tuning run: its train and val loss are on conversations, not FineWeb."""
        return "sft" in self.settings

    @property
    def reference(self) -> bool:
        """A reference run: a Hugging Face model measured as it is, never trained."""
        return bool(self.settings.get("reference"))

    @property
    def kind(self) -> str:
        if self.reference:
            return "reference"
        return "fine-tuning" if self.fine_tuned else "pretraining"

    @property
    def train_data(self) -> str:
        """The dataset its train and val losses are measured on."""
        return self.settings.get("dataset", "?")

    @property
    def finished(self) -> bool:
        return not self.missing

    @property
    def status(self) -> str:
        if self.finished:
            return "measured" if self.reference else "finished"
        if not self.train:
            return "not started"
        return "not finished"


RESULT_FILES = tuple(EVALUATIONS)  # the eval/ result files read: each registered evaluation's
NOT_SETTINGS = ("run", "evaluations", "chat_dataset")  # in a run's params, never a setting


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


def used_settings(run: Run) -> dict[str, Any]:
    """The run's settings as it used them: a fine-tuning run's steps and warmup follow from its
    epochs and data, so once it has finished they come from its final meta.json."""
    settings = {k: v for k, v in run.settings.items() if k not in NOT_SETTINGS}
    if run.meta and isinstance(run.meta.get("train"), dict):
        settings["train"] = run.meta["train"]
    return settings


def load_run(layout: Layout, name: str, settings: dict[str, Any]) -> Run:
    train_dir = Path(layout.train_dir(name))
    metrics = read_metrics(Path(layout.metrics(name)))
    run = Run(
        name, settings, metrics["train"], metrics["val"], metrics["hellaswag"], metrics["suite"]
    )
    run.provenance = read_json(train_dir / "provenance.json")
    run.restarts = summarise(read_attempts(Path(layout.attempts(name))))
    run.meta = read_json(Path(layout.final_checkpoint(name)) / "meta.json")
    if run.meta is None and not run.reference:
        run.missing.append("train/final/meta.json")
    eval_dir = Path(layout.eval_dir(name))
    for evaluation in RESULT_FILES:
        data = read_json(eval_dir / f"{evaluation}.json")
        if data is not None:
            run.evals[evaluation] = data
    expected = settings.get("evaluations", [])  # the evaluations the config gives this run
    run.missing += [f"eval/{e}.json" for e in expected if e not in run.evals]
    if "dataset" in settings:  # the text data (a fine-tuning run's is its base's)
        dataset = settings.get("text_dataset") or settings["dataset"]
        manifest = layout.tokens_manifest(dataset, settings.get("tokens_of"))
        run.manifest = (
            manifests.read_object(manifest, "tokens manifest") if Path(manifest).exists() else None
        )
    return run


# ----------------------------------------------------------------------------------------------
# the headline figures of a run


def _mean_after_first(rows: list[dict[str, Any]], key: str) -> float | None:
    """Mean of `key` over the train lines, leaving out the first (compile and warm-up)."""
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    if len(values) > 1:
        values = values[1:]
    return statistics.fmean(values) if values else None


def headline(run: Run, gpu_hour_price: float | None) -> dict[str, Any]:
    """One row of the headline table. Falls back to training-time figures before the end."""
    meta = run.meta or {}
    last = run.train[-1] if run.train else {}
    metrics: dict[str, float | None] = {}  # a headline column's key -> its value
    for name, evaluation in EVALUATIONS.items():
        for column in evaluation.columns:
            metrics[column.key] = run.evals.get(name, {}).get(column.field)
    notes: dict[str, str | None] = {}
    sources = run.evals.get("val_loss", {}).get("sources")
    if sources:  # a mixture's: not one shard's loss
        notes["val_loss"] = f"weighted mean of {len(sources)} sources (Data table)"
    if metrics.get("val_loss") is None and run.val and not run.fine_tuned:
        # before the val_loss evaluation ran: the last val loss logged in training (a fine-tuning
        # run's is on conversations, not the text dataset)
        metrics["val_loss"], notes["val_loss"] = run.val[-1]["val_loss"], "during training"
        metrics[BPB.key] = run.val[-1].get("val_bpb")
        notes[BPB.key] = "during training" if metrics[BPB.key] is not None else None
    else:
        metrics[BPB.key] = run.evals.get("val_loss", {}).get(BPB.field)
        if metrics[BPB.key] is None and "val_loss" in run.evals:
            notes[BPB.key] = "no byte table: data tokenized before it"
    # a loss in nats a token is in one tokenizer's tokens: its key says whose (loss_key)
    key = loss_key(tokens_of(run))
    if key != "val_loss":
        metrics[key] = metrics.pop("val_loss", None)
        notes[key] = notes.pop("val_loss", None)
    wall_s = meta.get("wall_s", last.get("wall_s"))
    world_size = meta.get("world_size", (run.provenance or {}).get("world_size"))
    device = run.settings.get("launch", {}).get("device")
    gpu_hours = None  # CPU runs have none (not zero: the table says "CPU")
    if device == "cuda":
        gpu_hours = meta.get("gpu_hours")
        if gpu_hours is None and wall_s is not None and world_size:  # still training
            gpu_hours = wall_s * world_size / 3600
    return {
        "name": run.name,
        "reference": run.reference,
        "model": run.settings.get("model", {}) if run.reference else None,
        "status": run.status,
        "missing": run.missing,
        "metrics": metrics,
        "notes": notes,
        "tokens": meta.get("tokens", last.get("tokens")),
        "step": meta.get("step", last.get("step")),
        "max_steps": (meta.get("train") or run.settings.get("train", {})).get("max_steps"),
        "wall_s": wall_s,
        "gpu_hours": gpu_hours,
        "cost": None if gpu_hours is None or gpu_hour_price is None else gpu_hours * gpu_hour_price,
        "tokens_per_s": _mean_after_first(run.train, "tokens_per_s"),
        "mfu": _mean_after_first(run.train, "mfu"),
        "device": device,
        "world_size": world_size,
    }


def by_recipe(runs: list[Run]) -> dict[str, list[Run]]:
    """The runs grouped by recipe (lmpipe.replicas: `a/seed=1338` is a replica of `a`), in the
    report's order."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(recipe_of(r.name), []).append(r)
    return groups


def pairs(names: list[str], compare: list[list[str]] | None) -> list[tuple[str, str]]:
    """(baseline, other) of each comparison among `names`: the report's `compare` pairs whose
    both runs are there, else each after the first against the first."""
    if compare:
        return [(base, other) for base, other in compare if base in names and other in names]
    return [(names[0], other) for other in names[1:]]


def _mean_sd(values: list[Any]) -> tuple[float, float] | None:
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return None
    return statistics.fmean(values), statistics.stdev(values)


def recipe_headlines(runs: list[Run], headlines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row for each replicated recipe: each headline figure's mean and standard deviation
    over its seeds (lmpipe.replicas)."""
    rows = {h["name"]: h for h in headlines}
    out = []
    for recipe, group in by_recipe(runs).items():
        if len(group) < 2:
            continue
        hs = [rows[r.name] for r in group]
        keys = {k for h in hs for k in h["metrics"]}
        out.append(
            {
                "name": recipe,
                "seeds": len(group),
                "metrics": {k: _mean_sd([h["metrics"].get(k) for h in hs]) for k in keys},
                **{k: _mean_sd([h[k] for h in hs]) for k in ("wall_s", "tokens_per_s", "mfu")},
                "tokens": _mean_sd([h["tokens"] for h in hs]),
            }
        )
    return out


def headline_columns(runs: list[Run]) -> list[Column]:
    """The columns of the evaluations any of the runs has (lmpipe.registry, in its order);
    the FineWeb val loss always (training logs it too)."""
    names = {e for r in runs for e in r.settings.get("evaluations", [])} | {"val_loss"}
    return [c for name, e in EVALUATIONS.items() if name in names for c in e.columns]


# ----------------------------------------------------------------------------------------------
# units: a loss in nats a token is in one tokenizer's tokens; bits per byte is in none

# the val loss in bits per byte (lmpipe.eval.val_loss): the column runs of any tokenizers share
BPB = Column("val_bpb", "FineWeb val bits per byte", "bits_per_byte", "loss")


def tokens_of(run: Run) -> str | None:
    """Whose tokens a run's val loss is in: an `arch: hf` model's own (its `models:` name, as
    its val_loss result or its settings say), or None for GPT-2's."""
    return run.evals.get("val_loss", {}).get("tokens_of") or run.settings.get("tokens_of")


def tokens_name(of: str | None) -> str:
    return "GPT-2's tokens" if of is None else f"{of}'s tokens"


def loss_key(of: str | None) -> str:
    """The headline key of a val loss in `of`'s tokens: GPT-2's keeps `val_loss` (the published
    figures' key, lmpipe.report.references, all in GPT-2's tokens)."""
    return "val_loss" if of is None else f"val_loss@{of}"


def unit_columns(runs: list[Run], columns: list[Column]) -> list[Column]:
    """`columns` with the val loss split by tokenizer, a column for each one the runs' val
    losses are in and labelled with it where it is not GPT-2's or they differ, so that no column
    holds losses in two tokenizers' tokens; bits per byte beside them, the one compared across
    tokenizers."""
    units = sorted({tokens_of(r) for r in runs}, key=lambda of: (of is not None, of or ""))
    out = []
    for c in columns:
        if c.key != "val_loss":
            out.append(c)
            continue
        for of in units:
            label = c.label if units == [None] else f"{c.label} (in {tokens_name(of)})"
            out.append(Column(loss_key(of), label, c.field, c.fmt))
        out.append(BPB)
    return out


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
