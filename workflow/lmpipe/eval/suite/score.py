"""The two suite evaluations, `evaluate` (native scorer) and `evaluate_lm_eval` (the harness),
and the one result dict both write (its fields: the package docstring, lmpipe.eval.suite).
Kept out of the package's __init__ so that `python -m lmpipe.eval.suite.data` (the download
stage, in the data env) imports neither torch nor lm-eval."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmpipe.eval.suite.data import SuiteDataError, TaskData, load_task, read_manifest
from lmpipe.eval.suite.metrics import TaskScore, task_metrics
from lmpipe.eval.suite.tasks import CORE_TASKS, TASKS
from lmpipe.registry import SuiteSettings


def load_tasks(
    manifest: Path, names: list[str], limit: int | None
) -> tuple[dict[str, TaskData], dict[str, str]]:
    """Each task's items; a task that cannot be read goes to the second dict with its error."""
    data, failed = {}, {}
    for name in names:
        try:
            data[name] = load_task(manifest, name, limit)
        except SuiteDataError as e:
            print(f"suite: {e}")
            failed[name] = str(e)
    if not data:
        raise SuiteDataError("no suite task could be read:\n" + "\n".join(failed.values()))
    return data, failed


def data_provenance(manifest: Path, names: list[str]) -> dict[str, Any]:
    """The data's package and each scored task's folder sha256, from the manifest."""
    m = read_manifest(manifest)
    return {
        "manifest": str(manifest),
        "package": m.package,
        "sha256": {n: m.tasks[n]["sha256"] for n in names if n in m.tasks},
    }


def suite_result(
    settings: SuiteSettings,
    data: dict[str, TaskData],
    scores: dict[str, tuple[TaskScore, dict[str, float | None]]],
    failed: dict[str, str],
    produced: dict[str, Any],
) -> dict[str, Any]:
    """The result dict (module docstring) from each task's per-item score and metrics; the
    per-item results carry the items' ids (TaskData.ids), what the report pairs two runs by."""
    tasks, per_item = {}, {}
    for name, (score, metrics) in scores.items():
        task = TASKS[name]
        tasks[name] = {
            **metrics,
            "headline": task.headline,
            "items": score.items,
            "split": task.split,
            "lm_eval_default_split": task.lm_eval_default_split,
        }
        if score.subjects:
            tasks[name]["subjects"] = dict(score.subjects)
        per_item[name] = {"ids": list(data[name].ids)} | {
            metric: list(getattr(score, metric)) for metric in task.metrics
        }
    core_tasks = [name for name in CORE_TASKS if name in tasks]
    core = (
        sum(tasks[n][tasks[n]["headline"]] for n in core_tasks) / len(core_tasks)
        if core_tasks
        else None
    )
    return {
        "metric": "suite",
        "value": core,
        "core": core,
        "core_tasks": core_tasks,
        "tasks": tasks,
        "per_item": per_item,
        "failed": failed,
        "complete": not failed,
        "items_limit": settings.items,
        "produced_by": produced,
    }


def evaluate(
    settings: SuiteSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    """The suite with the native batched scorer."""
    from lmpipe.data.tokenizer import model_tokenizer
    from lmpipe.eval.results import produced_by
    from lmpipe.eval.suite import native
    from lmpipe.models import load_hf
    from lmpipe.paths import TOKENIZER_DIR

    manifest = Path(inputs["suite"])
    data, failed = load_tasks(manifest, list(settings.tasks), settings.items)
    model = load_hf(model_dir).to(device)
    enc = model_tokenizer(model_dir, TOKENIZER_DIR)  # GPT-2's, or an hf model's own
    scores = {}
    for name, task_data in data.items():
        try:
            score = native.score_task(model, task_data, enc, settings.batch, device)
        except ValueError as e:  # a choice longer than the model: the other tasks still count
            print(f"suite: {e}")
            failed[name] = str(e)
            continue
        scores[name] = (score, task_metrics(TASKS[name], score))
    if not scores:
        raise SuiteDataError("no suite task could be scored:\n" + "\n".join(failed.values()))
    produced = produced_by(
        "lmpipe.eval.suite.native",
        model_dir,
        "lm_eval",
        data=data_provenance(manifest, list(data)),
        device=device,
    )
    return suite_result(settings, data, scores, failed, produced)


def harness_scores(
    settings: SuiteSettings,
    model_dir: Path,
    data: dict[str, TaskData],
    failed: dict[str, str],
    device: str,
) -> dict[str, tuple[TaskScore, dict[str, float | None]]]:
    """All the tasks in one harness run; should lm-eval fail on data our loader accepted, task by
    task (a model load each), so that one task's failure (into `failed`) keeps the others'."""
    from lmpipe.eval.suite import harness

    def run(part: dict[str, TaskData]) -> dict[str, tuple[TaskScore, dict[str, float | None]]]:
        # lm-eval's batch counts requests (one a choice), as settings.batch does
        out = harness.run(model_dir, part, settings.items, settings.batch, device)
        return harness.harness_scores(out, part)

    try:
        return run(data)
    except Exception as e:
        if len(data) == 1:
            raise
        print(f"suite: lm-eval failed on the tasks together ({type(e).__name__}: {e}); one by one")
    scores = {}
    for name, task_data in data.items():
        try:
            scores |= run({name: task_data})
        except Exception as e:
            failed[name] = f"suite task {name}: lm-eval harness: {type(e).__name__}: {e}"
    if not scores:
        raise SuiteDataError("lm-eval scored no suite task:\n" + "\n".join(failed.values()))
    return scores


def evaluate_lm_eval(
    settings: SuiteSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    """The suite through the real lm-eval harness (offline, the local tasks)."""
    from lmpipe.eval.harness import harness_model
    from lmpipe.eval.results import produced_by

    manifest = Path(inputs["suite"])
    data, failed = load_tasks(manifest, list(settings.tasks), settings.items)
    scores = harness_scores(settings, model_dir, data, failed, device)
    produced = produced_by(
        "lmpipe.eval.suite.harness",
        model_dir,
        "lm_eval",
        harness=f"lm-eval simple_evaluate, model {harness_model(model_dir)}, the local *_lmpipe"
        " tasks",
        data=data_provenance(manifest, list(data)),
        device=device,
    )
    return suite_result(settings, data, scores, failed, produced)
