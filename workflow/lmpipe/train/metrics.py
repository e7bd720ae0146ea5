"""metrics.jsonl and TensorBoard events of a run, written by rank 0.

One JSON object a line: a train step (`loss`, `lr`, `grad_norm`, `tokens_per_s`, `mfu`, `wall_s`),
a validation (`val_loss`) or HellaSwag during training (`hellaswag`: acc_norm, `hellaswag_acc`,
`hellaswag_items`, `eval_s`), each with `step` and `tokens`. The report reads these, not logs.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from lmpipe.files import read_json_lines
from lmpipe.paths import METRICS_FILE

log = logging.getLogger("lmpipe.train")


def lines_up_to(path: Path, step: int) -> list[str]:
    """The lines of `path` whose step is at most `step`, for a resume to keep. A torn last line
    (a kill mid-write) is dropped with a warning: its step is redone anyway."""
    rows, torn = read_json_lines(path)
    if torn is not None:
        log.warning("%s:%d: dropping a torn last line: %.80r", path, *torn)
    return [json.dumps(row) for _, row in rows if row["step"] <= step]


class Metrics:
    """metrics.jsonl + TensorBoard (rank 0); on resume, lines after the resumed step are dropped."""

    def __init__(self, out: Path, resume_step: int, enabled: bool):
        self.enabled = enabled
        if not enabled:
            return
        self.path = out / METRICS_FILE
        kept = []
        if resume_step > 0 and self.path.exists():
            kept = lines_up_to(self.path, resume_step)
        elif (out / "tb").exists():
            shutil.rmtree(out / "tb")  # a fresh start: old events would mix two trajectories
        self.path.write_text("".join(ln + "\n" for ln in kept))
        self.file = open(self.path, "a")
        self.tb = SummaryWriter(
            str(out / "tb"), purge_step=resume_step + 1 if resume_step else None
        )

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        group = "eval" if "hellaswag" in record else None  # eval/hellaswag, eval/eval_s, ...
        for key, value in record.items():
            if key not in ("step", "tokens") and value is not None:
                prefix = group or ("val" if key == "val_loss" else "train")
                self.tb.add_scalar(f"{prefix}/{key}", value, record["step"])

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            self.tb.close()
