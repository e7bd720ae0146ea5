"""The suite through the real lm-eval harness, offline, on the converted Hugging Face folder.

Each task is lm-eval's own (its YAML included: prompt, choices, metrics) with only the data
source replaced by the task's Arrow files from the suite's data folder (lm_eval_tasks/suite/, one
YAML a task), run by lmpipe.eval.harness's one runner of local tasks (`render_task`,
`run_local_tasks`), as HellaSwag's. MMLU is lm-eval's `mmlu` group rebuilt the same way: its 57
subject tasks and a group that aggregates them by size. `log_samples` gives the per-item
log-likelihoods and right/wrong calls, in each task's document order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lmpipe.eval.harness import render_task, run_local_tasks
from lmpipe.eval.suite.data import TaskData
from lmpipe.eval.suite.metrics import TaskScore, choose
from lmpipe.eval.suite.tasks import TASKS

TASK_DIR = Path(__file__).resolve().parents[1] / "lm_eval_tasks" / "suite"
MMLU_GROUP = "mmlu_lmpipe"


def local_name(name: str) -> str:
    """The local lm-eval task (or, for mmlu, group) of a suite task."""
    return MMLU_GROUP if name == "mmlu" else f"{name}_lmpipe"


def subject_task(subject: str) -> str:
    return f"mmlu_lmpipe_{subject}"


def write_tasks(data: dict[str, TaskData], work_dir: str | Path) -> Path:
    """Render the local tasks of the loaded tasks' data into `work_dir`/tasks."""
    work_dir = Path(work_dir)
    task_dir, cache = work_dir / "tasks", work_dir / "datasets_cache"
    task_dir.mkdir(parents=True, exist_ok=True)
    for name, task_data in data.items():
        if name == "mmlu":
            for subject, files in task_data.files.items():
                out = task_dir / f"{subject_task(subject)}.yaml"
                template = TASK_DIR / "mmlu_lmpipe_subject.yaml"
                render_task(template, out, files, cache, subject=subject)
            group = yaml.safe_load((TASK_DIR / f"{MMLU_GROUP}.yaml").read_text())
            group["task"] = [subject_task(s) for s in task_data.files]
            (task_dir / f"{MMLU_GROUP}.yaml").write_text(yaml.safe_dump(group, sort_keys=False))
        else:
            out = task_dir / f"{local_name(name)}.yaml"
            render_task(TASK_DIR / f"{local_name(name)}.yaml", out, task_data.files[""], cache)
    return task_dir


def run(
    model_dir: str | Path,
    data: dict[str, TaskData],
    limit: int | None,
    batch_size: int,
    device: str = "cpu",
) -> dict[str, Any]:
    """One `simple_evaluate` (the folder's model: `hf` or `lmpipe`; float32, zero-shot) over the
    tasks' local copies; returns lm-eval's results dict, with samples."""
    return run_local_tasks(
        model_dir,
        [local_name(name) for name in data],
        lambda work: write_tasks(data, work),
        limit,
        batch_size,
        device,
        log_samples=True,
    )


def samples_score(name: str, samples: list[dict], data: TaskData) -> TaskScore:
    """A TaskScore from lm-eval's logged samples of one task (one subject's, for mmlu)."""
    samples = sorted(samples, key=lambda s: s["doc_id"])
    score = TaskScore(name, [], [], [], [], [])
    for s, item in zip(samples, data.items, strict=True):
        ll = [float(r[0]) for r in s["filtered_resps"]]
        pred, pred_norm = choose(ll, item.choice_lengths)
        score.loglik.append(ll)
        score.pred.append(pred)
        score.pred_norm.append(pred_norm)
        score.acc.append(int(s["acc"]))
        score.acc_norm.append(int(s.get("acc_norm", pred_norm == item.gold)))
    return score


def harness_scores(
    out: dict[str, Any], data: dict[str, TaskData]
) -> dict[str, tuple[TaskScore, dict[str, float | None]]]:
    """Per task: lm-eval's per-item outcome and its own aggregated metrics."""
    scores = {}
    for name, task_data in data.items():
        task = TASKS[name]
        if name == "mmlu":
            parts, start = [], 0
            for subject, n in task_data.subjects.items():
                sub = TaskData(name, task_data.items[start : start + n], {})
                parts.append(samples_score(name, out["samples"][subject_task(subject)], sub))
                start += n
            score = TaskScore(name, [], [], [], [], [], dict(task_data.subjects))
            for part in parts:
                for field in ("loglik", "pred", "pred_norm", "acc", "acc_norm"):
                    getattr(score, field).extend(getattr(part, field))
        else:
            score = samples_score(name, out["samples"][local_name(name)], task_data)
        results = out["results"][local_name(name)]
        metrics: dict[str, float | None] = {}
        for metric in task.metrics:
            metrics[metric] = float(results[f"{metric},none"])
            stderr = results.get(f"{metric}_stderr,none")
            metrics[f"{metric}_stderr"] = float(stderr) if isinstance(stderr, float) else None
        scores[name] = (score, metrics)
    return scores
