"""metrics.jsonl and TensorBoard events of a run, written by rank 0.

One JSON object a line: a train step (`loss`, `lr`, `grad_norm`, `tokens_per_s`, `mfu`, `wall_s`),
a validation (`val_loss`) or an evaluation during training (lmpipe.train.evaluators: one line
an evaluation, its tasks' figures and `eval_s`; HellaSwag's `hellaswag`: acc_norm,
`hellaswag_acc`, `hellaswag_items`; the suite's, for each task, `suite/<task>`: acc_norm where the
task has it, else acc; `suite/<task>_acc`, `suite/<task>_items`), each with `step` and `tokens`.
The report reads these, not logs. With `logging.wandb`, the same records go to Weights & Biases
too (lmpipe.train.wandb_log).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from lmpipe.config import WandbConfig
from lmpipe.files import read_json_lines
from lmpipe.paths import METRICS_FILE
from lmpipe.train.wandb_log import WandbLog, scalars

log = logging.getLogger("lmpipe.train")


def lines_up_to(path: Path, step: int) -> tuple[list[str], int]:
    """The lines of `path` whose step is at most `step`, for a resume to keep, and the last step
    the file reached (what the attempt before logged). A torn last line (a kill mid-write) is
    dropped with a warning: its step is redone anyway."""
    rows, torn = read_json_lines(path)
    if torn is not None:
        log.warning("%s:%d: dropping a torn last line: %.80r", path, *torn)
    reached = max((row["step"] for _, row in rows), default=-1)
    return [json.dumps(row) for _, row in rows if row["step"] <= step], reached


@dataclass(frozen=True)
class WandbRun:
    """What opening the run's W&B run takes (logging.wandb on): see lmpipe.train.wandb_log."""

    settings: WandbConfig
    run: str
    digest: str  # the settings hash: part of the W&B run's id
    config: dict[str, Any]


class Metrics:
    """metrics.jsonl + TensorBoard (+ W&B) on rank 0; on resume, lines after the resumed step
    are dropped (and W&B skips the steps it has: they are redone bit for bit)."""

    def __init__(self, out: Path, resume_step: int, enabled: bool, wandb: WandbRun | None = None):
        self.enabled = enabled
        self.wandb: WandbLog | None = None
        if not enabled:
            return
        self.path = out / METRICS_FILE
        kept, reached = [], -1
        if resume_step > 0 and self.path.exists():
            kept, reached = lines_up_to(self.path, resume_step)
        elif (out / "tb").exists():
            shutil.rmtree(out / "tb")  # a fresh start: old events would mix two trajectories
        self.path.write_text("".join(ln + "\n" for ln in kept))
        self.file = open(self.path, "a")
        self.tb = SummaryWriter(
            str(out / "tb"), purge_step=resume_step + 1 if resume_step else None
        )
        if wandb is not None:
            self.wandb = WandbLog(
                wandb.settings, out, wandb.run, wandb.digest, wandb.config, logged_until=reached
            )

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        for name, value in scalars(record).items():
            self.tb.add_scalar(name, value, record["step"])
        if self.wandb is not None:
            self.wandb.write(record)

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            self.tb.close()
            if self.wandb is not None:
                self.wandb.close()
