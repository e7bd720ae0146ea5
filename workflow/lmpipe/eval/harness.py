"""HellaSwag through the real lm-eval harness, offline, on the converted Hugging Face folder.

The task is lm-eval's own `hellaswag` (prompt, choices, metrics) with only the data source
replaced by a local file (lm_eval_tasks/hellaswag_lmpipe.yaml), so it runs without the hub.
lm-eval's model is `hf` for a GPT-2 folder (transformers' GPT2LMHeadModel) and `lmpipe` (the
native model: lmpipe.eval.lm_eval_model) for any other architecture (`harness_model`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from lmpipe.eval.hellaswag import NUM_ENDINGS
from lmpipe.eval.results import produced_by
from lmpipe.registry import HellaSwagSettings

LM_EVAL_TASK_DIR = Path(__file__).parent / "lm_eval_tasks"
LM_EVAL_TASK = "hellaswag_lmpipe"


def write_lm_eval_task(items_file: str | Path, work_dir: str | Path) -> Path:
    """Render the local task (lm_eval_tasks/) into `work_dir` with absolute paths; see its YAML."""
    import lm_eval

    task = yaml.safe_load((LM_EVAL_TASK_DIR / f"{LM_EVAL_TASK}.yaml").read_text())
    upstream = Path(lm_eval.__file__).parent / "tasks" / task["include"]
    if not upstream.is_file():
        raise FileNotFoundError(f"{upstream}: lm-eval's hellaswag task not found")
    task["include"] = str(upstream)
    task["dataset_kwargs"]["data_files"]["validation"] = str(Path(items_file).resolve())
    task["dataset_kwargs"]["cache_dir"] = str(Path(work_dir).resolve() / "datasets_cache")
    task_dir = Path(work_dir) / "tasks"
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / f"{LM_EVAL_TASK}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    shutil.copy(LM_EVAL_TASK_DIR / "utils.py", task_dir / "utils.py")
    return task_dir


def harness_model(model_dir: str | Path) -> str:
    """lm-eval's model for a converted folder: `hf` for GPT-2 (its config.json's `lmpipe_arch`,
    absent in OpenAI's own folder), else `lmpipe`, registered by importing its module."""
    arch = json.loads((Path(model_dir) / "config.json").read_text()).get("lmpipe_arch", "gpt2")
    if arch == "gpt2":
        return "hf"
    from lmpipe.eval.lm_eval_model import MODEL_NAME

    return MODEL_NAME


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
    if model == "lmpipe":
        import lmpipe.eval.lm_eval_model  # noqa: F401  registers it
    model = model or harness_model(model_dir)
    if items_file is not None:  # offline: never reach for the hub
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    import lm_eval
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="lmpipe_lm_eval_") as work:
        if items_file is None:
            task, manager = "hellaswag", TaskManager()
        else:
            task = LM_EVAL_TASK
            # only the local task: it includes lm-eval's by absolute path, so indexing lm-eval's
            # thousands of task files (a minute on two cores) would buy nothing
            tasks = write_lm_eval_task(items_file, work)
            manager = TaskManager(include_path=str(tasks), include_defaults=False)
        return lm_eval.simple_evaluate(
            model=model,
            model_args={"pretrained": str(model_dir), "dtype": "float32"},
            tasks=[task],
            task_manager=manager,
            num_fewshot=0,
            limit=limit,
            batch_size=batch_size,
            device=device,
            log_samples=log_samples,
            bootstrap_iters=0,
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
