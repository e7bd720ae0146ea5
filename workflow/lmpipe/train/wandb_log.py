"""Weights & Biases beside metrics.jsonl (a run's `logging.wandb`), written by rank 0.

The same records as metrics.jsonl and TensorBoard, under TensorBoard's names (`train/loss`,
`val/val_loss`, `eval/hellaswag`), with the run's `step` as the x axis. `wandb` is imported only
here and only when a run sets `logging.wandb`: it is the `[wandb]` extra, not a dependency of
every training job (envs/train.yaml leaves it out; tests/test_envs.py holds the import lazy).

- Files stay in the run's folder: wandb's run files, cache, config and data dirs all under
  `train/wandb/` (its environment variables, set before the import), nothing in ~ or the cwd.
- A restarted job continues the same W&B run: its id is the run's name and settings hash
  (`run_id`), opened with resume="allow". Steps the earlier attempt logged are not logged
  again (they are redone bit for bit): W&B would draw each twice, and refuses a `step=` lower
  than its last, so the step is a metric (`define_metric(step_metric="step")`) instead.
- Only settings are sent as its config; never the environment (WANDB_API_KEY stays wandb's own).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from lmpipe.config import WandbConfig, settings_hash

WANDB_DIR = "wandb"  # under the run's train/ folder
# every place wandb 0.31 writes besides its run folder (wandb/env.py), redirected under WANDB_DIR
DIR_VARIABLES = ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR",
                 "WANDB_ARTIFACT_DIR")  # fmt: skip


def run_id(run: str, digest: str) -> str:
    """A stable W&B run id: the run's name in the characters W&B allows (a sweep point's
    `/`, `=`, `.` and `+` become `-`), then a hash of the full name and the settings: names
    alike after that get runs of their own, and so does a run retrained with other settings."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", run)[:40]
    return f"{safe}-{settings_hash([run, digest])}"


def check_installed(run: str) -> None:
    """Fail before training starts when W&B is asked for but not installed."""
    if importlib.util.find_spec("wandb") is None:
        raise RuntimeError(
            f"runs.{run}.logging.wandb is set, but wandb is not installed: pip install"
            " 'lmpipe[wandb]' (under --use-conda, add wandb==0.31.0 to envs/train.yaml)"
        )


# a record's keys that are not figures to plot: its place, and the val loss's per-document sums
NOT_SCALARS = ("step", "tokens", "val_documents")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl record's figures under their logged names (TensorBoard and W&B)."""
    # an evaluation's line (it has eval_s): eval/hellaswag, eval/suite/arc_easy, eval/eval_s
    group = "eval" if "eval_s" in record else None
    out = {}
    for key, value in record.items():
        if key not in NOT_SCALARS and value is not None:
            prefix = group or ("val" if key.startswith("val_") else "train")
            if isinstance(value, dict):  # a mixture's figures by source: train/tokens_by_source/a
                out |= {f"{prefix}/{key}/{k}": v for k, v in value.items()}
            else:
                out[f"{prefix}/{key}"] = value
    return out


class WandbLog:
    """One W&B run for a training run, continued across its restarts."""

    def __init__(
        self,
        settings: WandbConfig,
        out: Path,
        run: str,
        digest: str,
        config: dict[str, Any],
        logged_until: int,
    ):
        self.logged_until = logged_until  # the last step an earlier attempt logged; -1: none
        root = out / WANDB_DIR
        root.mkdir(parents=True, exist_ok=True)
        for variable in DIR_VARIABLES:
            os.environ[variable] = str(root)
        import wandb  # the [wandb] extra: only when logging.wandb is set

        self.wandb = wandb
        self.run = wandb.init(
            project=settings.project,
            group=settings.group,
            mode=settings.mode,
            id=run_id(run, digest),
            name=run,
            resume="allow",
            dir=str(root),
            config=config,
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def write(self, record: dict[str, Any]) -> None:
        if record["step"] <= self.logged_until:
            return  # logged by the attempt before the resume
        self.run.log({"step": record["step"], "tokens": record["tokens"], **scalars(record)})

    def close(self) -> None:
        """Finish the run and wait for wandb's service: `finish()` may return before the
        service has written the run's file (seen offline, under load), and wandb's own atexit
        teardown is "not reliable in certain setups"; the files are complete when training ends."""
        self.run.finish()
        self.wandb.teardown()


def run_config(job: Any, train: Any) -> dict[str, Any]:
    """What W&B shows as the run's config: its settings (model, train, placement), nothing else."""
    return {
        "run": job.run,
        "dataset": job.dataset,
        "model": dataclasses.asdict(job.model),
        "train": dataclasses.asdict(train),
        "launch": dataclasses.asdict(job.launch),
    }
