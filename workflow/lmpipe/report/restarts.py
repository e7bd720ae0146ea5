"""What a run survived, from train/attempts.jsonl (written by lmpipe.train.attempts, see there).

The history counted is the current trajectory's: the attempts since the last `fresh_start`, of
the last attempt's settings hash (an attempt of other settings trained another model). For each
restart, i.e. an attempt followed by another:

- its cause: "signal" (its end line names the signal), "error" (the exception's type), "killed"
  (no end line: SIGKILL, the OOM killer, a node lost). An attempt after a finished one is a
  rerun (e.g. `--forcerun`), not a restart;
- steps redone: the step the attempt reached minus the step the next resumed from. A killed
  attempt's reach is its last progress or checkpoint line, so its figure may be short by the
  steps of PROGRESS_EVERY_S (a minute): `at_least`;
- wall time lost: from when the state the next attempt resumed existed (the checkpoint line of
  that step, or the start of an attempt at that step) to the next attempt's start, which is
  written once its state is loaded: the steps thrown away, the time down, the restart. A
  run's trained wall time (final/meta.json, metrics' `wall_s`) counts none of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from lmpipe.files import read_json_lines


def read_attempts(path: Path) -> list[dict[str, Any]]:
    """The lines of attempts.jsonl, [] without one. The last line may be torn by a kill (or
    still being written): skipped. A broken line elsewhere names the file and line."""
    if not path.exists():
        return []
    rows = []
    for i, row in read_json_lines(path)[0]:
        if not isinstance(row, dict) or "event" not in row or "time" not in row:
            raise ValueError(f"{path}:{i}: expected an event and a time, got {str(row)[:80]!r}")
        rows.append(row)
    return rows


def _time(row: dict[str, Any]) -> float:
    return datetime.fromisoformat(row["time"]).timestamp()


@dataclass
class Attempt:
    """One start of the trainer: its start line, its checkpoint and progress lines, its end."""

    start: dict[str, Any]
    marks: list[dict[str, Any]] = field(default_factory=list)  # checkpoint and progress lines
    end: dict[str, Any] | None = None

    @property
    def reached(self) -> int:
        """The last step it is known to have trained."""
        if self.end is not None:
            return self.end["step"]
        return max([self.start["resumed_step"], *(m["step"] for m in self.marks)])

    @property
    def how(self) -> str:
        """finished, signal, error, or killed (no end line; the last attempt may be running)."""
        return "killed" if self.end is None else self.end["how"]

    @property
    def why(self) -> str | None:
        """The signal's name or the error's type."""
        if self.end is None:
            return None
        if self.how == "signal":
            return self.end.get("signal")
        if self.how == "error":
            return (self.end.get("error") or "").split(":")[0] or None
        return None

    def state_time(self, step: int) -> float | None:
        """When this attempt had the state of `step` (saved, or started from), the latest."""
        for mark in reversed(self.marks):
            if mark["event"] == "checkpoint" and mark["step"] == step:
                return _time(mark)
        return _time(self.start) if self.start["resumed_step"] == step else None


@dataclass
class Restart:
    """An attempt that ended without finishing, and the one that took over."""

    after: int  # the attempt that ended (its number in the file)
    cause: str  # signal, error, killed
    why: str | None  # SIGUSR1, NonFiniteLossError, ...
    reached: int  # the step the attempt that ended reached
    resumed_step: int  # the step the next one resumed from
    steps_redone: int
    at_least: bool  # killed: steps after its last progress line are not known
    lost_s: float | None  # None: the resumed state's time is not in the history


@dataclass
class Skipped:
    """An attempt that resumed from an older checkpoint than the newest one saved before it: the
    newer one was unusable (moved to checkpoints/broken/ by the trainer) or gone."""

    attempt: int  # the attempt that resumed
    resumed_step: int
    newest: int  # the newest checkpoint saved before it
    steps_redone: int  # from where it resumed to the step the history had reached

    def __str__(self) -> str:
        return (
            f"attempt {self.attempt} resumed from step {self.resumed_step}, not from the newer"
            f" checkpoint of step {self.newest} (unusable: broken or gone):"
            f" {self.steps_redone} step(s) redone"
        )


@dataclass
class Restarts:
    """A run's attempts and what its restarts cost."""

    attempts: list[Attempt]
    restarts: list[Restart]
    reruns: int  # attempts after a finished one
    earlier: int  # attempts of retired checkpoints or other settings, not counted
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.restarts

    @property
    def by_cause(self) -> dict[str, int]:
        """How many restarts each cause: "signal SIGUSR1", "killed", "error ValueError", ..."""
        counts: dict[str, int] = {}
        for r in self.restarts:
            key = r.cause + (f" {r.why}" if r.why else "")
            counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def steps_redone(self) -> int:
        return sum(r.steps_redone for r in self.restarts)

    @property
    def at_least(self) -> bool:
        return any(r.at_least for r in self.restarts)

    @property
    def lost_s(self) -> float:
        """Wall time lost over the restarts whose loss is known."""
        return sum(r.lost_s for r in self.restarts if r.lost_s is not None)

    @property
    def lost_unknown(self) -> int:
        return sum(r.lost_s is None for r in self.restarts)

    @property
    def job_ids(self) -> list[str | None]:
        """Each attempt's SLURM job id, in order (None: not under SLURM)."""
        return [a.start.get("job_id") for a in self.attempts]

    @property
    def last(self) -> str:
        """How the last attempt stands: finished, signal, error, or no end line (yet)."""
        how = self.attempts[-1].how
        return "running or killed" if how == "killed" else how


def group(rows: list[dict[str, Any]]) -> list[Attempt]:
    """The lines by attempt, in the file's order (lines before any start are ignored)."""
    attempts: list[Attempt] = []
    for row in rows:
        if row["event"] == "start":
            attempts.append(Attempt(row))
        elif attempts and row.get("attempt") == attempts[-1].start.get("attempt"):
            if row["event"] == "end":
                attempts[-1].end = row
            elif row["event"] in ("checkpoint", "progress"):
                attempts[-1].marks.append(row)
    return attempts


def current(attempts: list[Attempt]) -> list[Attempt]:
    """The attempts of the current trajectory: back from the last, while the settings hash is
    the same, up to and including a fresh start."""
    digest = attempts[-1].start.get("settings_hash")
    first = len(attempts) - 1
    while (
        first > 0
        and not attempts[first].start.get("fresh_start")
        and attempts[first - 1].start.get("settings_hash") == digest
    ):
        first -= 1
    return attempts[first:]


def summarise(rows: list[dict[str, Any]]) -> Restarts | None:
    """attempts.jsonl's lines as the report shows them; None without any attempt."""
    every = group(rows)
    if not every:
        return None
    attempts = current(every)
    restarts, reruns = [], 0
    for i, (ended, nxt) in enumerate(zip(attempts, attempts[1:], strict=False)):
        if ended.how == "finished":
            reruns += 1
            continue
        resumed = nxt.start["resumed_step"]
        state_at = next(
            (t for a in reversed(attempts[: i + 1]) if (t := a.state_time(resumed)) is not None),
            None,
        )
        restarts.append(
            Restart(
                after=ended.start["attempt"],
                cause=ended.how,
                why=ended.why,
                reached=ended.reached,
                resumed_step=resumed,
                steps_redone=max(0, ended.reached - resumed),
                at_least=ended.end is None,
                lost_s=None if state_at is None else _time(nxt.start) - state_at,
            )
        )
    return Restarts(attempts, restarts, reruns, len(every) - len(attempts), skipped(attempts))


def skipped(attempts: list[Attempt]) -> list[Skipped]:
    """The attempts that resumed from older state than the newest checkpoint saved before."""
    out, newest, reached = [], -1, 0  # newest: the newest checkpoint saved so far (-1: none)
    for a in attempts:
        resumed = a.start["resumed_step"]
        if newest > resumed:
            out.append(Skipped(a.start["attempt"], resumed, newest, max(0, reached - resumed)))
        newest = max([newest, *(m["step"] for m in a.marks if m["event"] == "checkpoint")])
        reached = max(reached, a.reached)
    return out
