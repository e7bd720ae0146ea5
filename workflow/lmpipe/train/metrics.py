"""metrics.jsonl and TensorBoard events of a run, written by rank 0.

One JSON object a line: a train step (`loss`, `lr`, `grad_norm`, `tokens_per_s`, `mfu`, `wall_s`),
a validation (`val_loss`) or HellaSwag during training (`hellaswag`: acc_norm, `hellaswag_acc`,
`hellaswag_items`, `eval_s`), each with `step` and `tokens`. The report reads these, not logs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter


class Metrics:
    """metrics.jsonl + TensorBoard (rank 0); on resume, lines after the resumed step are dropped."""

    def __init__(self, out: Path, resume_step: int, enabled: bool):
        self.enabled = enabled
        if not enabled:
            return
        self.path = out / "metrics.jsonl"
        kept = []
        if resume_step > 0 and self.path.exists():
            kept = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
            kept = [ln for ln in kept if json.loads(ln)["step"] <= resume_step]
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
