"""attempts.jsonl: what each start of the trainer did, written by rank 0 as it happens.

A run that is stopped and resumed (a SLURM time limit, a preemption, a crash and Snakemake's
retry) trains in several attempts. Each one appends, with its `event`, its `attempt` number (1, 2,
... counted in the file) and the `time` (UTC, ISO 8601):

- `start`, once its state is loaded: `resumed_step` (0: from scratch), `checkpoint` (the folder
  resumed, its name under checkpoints/, or null), `job_id` (SLURM_JOB_ID, or null), `host`,
  `world_size`, `settings_hash` (the trajectory's), `fresh_start` (true after --fresh-start:
  the attempts before it trained the retired checkpoints, not this trajectory);
- `checkpoint` at each save: `step` (asynchronous saves: the state taken then, on disk later);
- `progress` at most every PROGRESS_EVERY_S of training: `step`, how far an attempt that is
  killed got;
- `end`: `step` (the last completed) and `how`: "finished", "signal" (+ `signal`, e.g.
  "SIGUSR1"; null when only another rank got one) or "error" (+ `error`, "Type: message").

An attempt killed outright (SIGKILL, the OOM killer, a node lost) writes no end line: the
absence is the record. The report reads the file (lmpipe.report.restarts), never the logs.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lmpipe.paths import ATTEMPTS_FILE

log = logging.getLogger("lmpipe.train")

PROGRESS_EVERY_S = 60.0  # a killed attempt's steps are known to within this much training
ERROR_CHARS = 200  # an error's message is cut to this: the log has it whole


def short_error(error: BaseException) -> str:
    """The error as "Type: first line of its message", at most ERROR_CHARS characters."""
    message = str(error).strip().splitlines()
    text = type(error).__name__ + (f": {message[0]}" if message else "")
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def cut_torn_tail(path: Path) -> None:
    """Remove a last line without its newline (a kill mid-write), so that the next line
    appended starts a line of its own."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        log.warning("%s: dropping a torn last line: %.80r", path, data[keep:])
        with open(path, "r+b") as f:
            f.truncate(keep)


def count_starts(path: Path) -> int:
    """The attempts the file records (its start lines)."""
    starts = 0
    for line in path.read_text().splitlines():
        try:
            starts += json.loads(line).get("event") == "start"
        except (json.JSONDecodeError, AttributeError):
            continue  # not this writer's to judge: the report names a broken line
    return starts


class AttemptLog:
    """One attempt's lines in train/attempts.jsonl; does nothing on ranks but 0."""

    def __init__(self, out: Path, enabled: bool) -> None:
        self.path = out / ATTEMPTS_FILE
        self.enabled = enabled
        self.attempt = 0  # 0: not started
        self.step = 0
        self.ended = False
        self._progress_at = 0.0  # time.monotonic() of the last line with a step

    def _write(self, event: str, **fields: Any) -> None:
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        line = {"event": event, "attempt": self.attempt, "time": now, **fields}
        with open(self.path, "a") as f:  # opened a line at a time: a kill tears one line at most
            f.write(json.dumps(line) + "\n")
        self._progress_at = time.monotonic()

    def start(
        self,
        step: int,
        checkpoint: Path | None,
        world_size: int,
        settings_hash: str,
        fresh_start: bool,
    ) -> None:
        """The attempt has its state: from `checkpoint` at `step`, or from scratch."""
        self.step = step
        if not self.enabled:
            return
        if self.path.exists():
            cut_torn_tail(self.path)
            self.attempt = count_starts(self.path) + 1
        else:
            self.attempt = 1
        self._write(
            "start",
            resumed_step=step,
            checkpoint=None if checkpoint is None else checkpoint.name,
            job_id=os.environ.get("SLURM_JOB_ID"),
            host=socket.gethostname(),
            world_size=world_size,
            settings_hash=settings_hash,
            fresh_start=fresh_start,
        )

    def stepped(self, step: int) -> None:
        """After each step: a progress line if the last line with a step is old enough."""
        self.step = step
        if self.attempt and time.monotonic() - self._progress_at >= PROGRESS_EVERY_S:
            self._write("progress", step=step)

    def saved(self, step: int) -> None:
        """A checkpoint of `step` was saved (or, asynchronously, its state taken)."""
        if self.attempt:
            self._write("checkpoint", step=step)

    def end(self, how: str, **why: str) -> None:
        """The attempt ends: "finished", "signal" (signal=NAME) or "error" (error=TEXT); once."""
        if self.attempt and not self.ended:
            self.ended = True
            self._write("end", step=self.step, how=how, **why)
