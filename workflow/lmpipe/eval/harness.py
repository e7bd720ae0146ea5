"""The real lm-eval harness, offline, on local tasks; and HellaSwag through it.

The one runner of lm-eval here: HellaSwag's evaluation (`hellaswag_lm_eval`, below) and the
suite's (`suite_lm_eval`, lmpipe.eval.suite.harness) both render local task YAMLs (lm_eval_tasks/:
lm-eval's own task included, only the data source replaced) into a scratch folder with
`render_task` and run them with `run_local_tasks`: only those tasks indexed, hub and datasets
offline, zero-shot, float32. lm-eval's model is `hf` for a GPT-2 folder (transformers'
GPT2LMHeadModel) and `lmpipe` (the native model: lmpipe.eval.lm_eval_model) for any other
architecture (`harness_model`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from lmpipe.eval.hellaswag import NUM_ENDINGS
from lmpipe.eval.results import produced_by
from lmpipe.registry import HellaSwagSettings

LM_EVAL_TASK_DIR = Path(__file__).parent / "lm_eval_tasks"
LM_EVAL_TASK = "hellaswag_lmpipe"


# ---- the runner ---------------------------------------------------------------------------------


def lm_eval_tasks_dir() -> Path:
    """lm-eval's own task YAMLs, which a local task includes."""
    import lm_eval

    return Path(lm_eval.__file__).parent / "tasks"


def render_task(
    template: Path,
    out: Path,
    files: str | Path | list[Path],
    cache_dir: Path,
    **names: str,
) -> None:
    """Write a local task YAML (`template`, its `{name}`s filled in from `names`) to `out` with
    its `include` made absolute (lm-eval's installed task) and the one split of its
    `dataset_kwargs.data_files` set to `files` (a file, or a list of files), absolute; datasets'
    cache in `cache_dir`."""
    text = template.read_text()
    task = yaml.safe_load(text.format(**names) if names else text)
    upstream = lm_eval_tasks_dir() / task["include"]
    if not upstream.is_file():
        raise FileNotFoundError(f"{upstream}: lm-eval's task {task['include']} not found")
    task["include"] = str(upstream)
    [split] = task["dataset_kwargs"]["data_files"]
    if isinstance(files, list):
        task["dataset_kwargs"]["data_files"][split] = [str(Path(f).resolve()) for f in files]
    else:
        task["dataset_kwargs"]["data_files"][split] = str(Path(files).resolve())
    task["dataset_kwargs"]["cache_dir"] = str(Path(cache_dir).resolve())
    out.write_text(yaml.safe_dump(task, sort_keys=False))


def harness_model(model_dir: str | Path) -> str:
    """lm-eval's model for a converted folder: `hf` for GPT-2 (its config.json's `lmpipe_arch`,
    absent in OpenAI's own folder) and any `model.arch: hf` export (the model's own class and
    tokenizer), else `lmpipe`, registered by importing its module."""
    arch = json.loads((Path(model_dir) / "config.json").read_text()).get("lmpipe_arch", "gpt2")
    if arch in ("gpt2", "hf"):
        return "hf"
    from lmpipe.eval.lm_eval_model import MODEL_NAME

    return MODEL_NAME


def run_local_tasks(
    model_dir: str | Path,
    tasks: list[str],
    write: Callable[[Path], Path] | None,
    limit: int | None,
    batch_size: int,
    device: str = "cpu",
    log_samples: bool = False,
    bootstrap_iters: int = 100_000,
    model: str | None = None,
    model_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One `simple_evaluate` of `tasks` (zero-shot, float32); returns lm-eval's results dict.

    `write(work_dir)` renders the local tasks into a scratch folder and returns it: then only
    those are indexed (they include lm-eval's by absolute path, so indexing lm-eval's thousands
    of task files, a minute on two cores, would buy nothing) and the hub is never reached.
    `write` None: lm-eval's own tasks and data (the internet). `model`: lm-eval's model (`hf` or
    `lmpipe`; None: the folder's, `harness_model`), and its `model_args` (None: the folder,
    float32; another model's, e.g. `local-completions` pointed at `lmpipe serve`).
    `bootstrap_iters` 0: no standard errors.
    """
    if write is not None:
        offline()
    model = model or harness_model(model_dir)
    if model == "lmpipe":
        import lmpipe.eval.lm_eval_model  # noqa: F401  registers it
    import lm_eval
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="lmpipe_lm_eval_") as work:
        manager = (
            TaskManager()
            if write is None
            else TaskManager(include_path=str(write(Path(work))), include_defaults=False)
        )
        return lm_eval.simple_evaluate(
            model=model,
            model_args=model_args or {"pretrained": str(model_dir), "dtype": "float32"},
            tasks=tasks,
            task_manager=manager,
            num_fewshot=0,
            limit=limit,
            batch_size=batch_size,
            device=device,
            log_samples=log_samples,
            bootstrap_iters=bootstrap_iters,
        )


def offline() -> None:
    """Never reach for the hub: the variables, and datasets' own flags (it reads the variables
    at import, and a loader may have imported it already)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets

    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True


# ---- HellaSwag ----------------------------------------------------------------------------------


def write_lm_eval_task(items_file: str | Path, work_dir: str | Path) -> Path:
    """Render HellaSwag's local task (lm_eval_tasks/) into `work_dir`/tasks, with lm-eval's
    preprocessing (utils.py) beside it; see its YAML."""
    task_dir = Path(work_dir) / "tasks"
    task_dir.mkdir(parents=True, exist_ok=True)
    render_task(
        LM_EVAL_TASK_DIR / f"{LM_EVAL_TASK}.yaml",
        task_dir / f"{LM_EVAL_TASK}.yaml",
        items_file,
        Path(work_dir) / "datasets_cache",
    )
    shutil.copy(LM_EVAL_TASK_DIR / "utils.py", task_dir / "utils.py")
    return task_dir


def lm_eval_hellaswag(
    model_dir: str | Path,
    items_file: str | Path | None,
    limit: int,
    batch_size: int,
    device: str = "cpu",
    log_samples: bool = False,
    model: str | None = None,
) -> dict:
    """Run the real harness on HellaSwag; returns lm-eval's results dict.

    `items_file` None uses lm-eval's own `hellaswag` task and data (needs the internet);
    otherwise the local task on that file, offline. `model`: lm-eval's model (`hf` or
    `lmpipe`; None: the folder's, `harness_model`).
    """
    local = items_file is not None
    return run_local_tasks(
        model_dir,
        [LM_EVAL_TASK if local else "hellaswag"],
        (lambda work: write_lm_eval_task(items_file, work)) if local else None,
        limit,
        batch_size,
        device,
        log_samples=log_samples,
        bootstrap_iters=0,
        model=model,
    )


def evaluate(
    settings: HellaSwagSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    items_file = inputs.get("hellaswag")  # None: lm-eval's own data (the internet)
    # lm-eval's batch counts requests (one per ending): the same rows a batch as the native scorer
    results = lm_eval_hellaswag(
        model_dir, items_file, settings.items, settings.batch * NUM_ENDINGS, device
    )
    task = "hellaswag" if items_file is None else LM_EVAL_TASK
    metrics = results["results"][task]
    return {
        "metric": "hellaswag",
        "value": metrics["acc_norm,none"],
        "acc": metrics["acc,none"],
        "acc_norm": metrics["acc_norm,none"],
        "items": results["n-samples"][task]["effective"],
        "produced_by": produced_by(
            __name__,
            model_dir,
            "lm_eval",
            harness=f"lm-eval simple_evaluate, model {harness_model(model_dir)}, task {task}",
            items_file=str(items_file) if items_file else "lm-eval's own hellaswag data",
            device=device,
        ),
    }
