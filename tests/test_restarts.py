"""attempts.jsonl: the trainer's writer (lmpipe.train.attempts) and the report's summary of it
(lmpipe.report.restarts), against the contract in their docstrings and docs/architecture.md.

The summary's cases are written by hand, at known times; the writer's are read back through the
summary. Real kills and signals: tests/test_train.py and tests/test_launch.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lmpipe.report.restarts import read_attempts, summarise
from lmpipe.train import attempts as writer
from lmpipe.train.attempts import AttemptLog, short_error

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


def start(attempt: int, t: float, step: int = 0, job: str | None = None, **more) -> dict:
    fields = {"resumed_step": step, "checkpoint": f"step_{step:06d}" if step else None}
    fields |= {"job_id": job, "host": "n1", "world_size": 2, "settings_hash": "h"}
    return {
        "event": "start",
        "attempt": attempt,
        "time": at(t),
        **fields,
        "fresh_start": False,
    } | more


def mark(event: str, attempt: int, t: float, step: int) -> dict:
    return {"event": event, "attempt": attempt, "time": at(t), "step": step}


def end(attempt: int, t: float, step: int, how: str, **why) -> dict:
    return {"event": "end", "attempt": attempt, "time": at(t), "step": step, "how": how, **why}


def write(path: Path, rows: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


# ---- the summary ------------------------------------------------------------------------------


def test_one_clean_attempt_has_nothing_to_survive():
    s = summarise(
        [start(1, 0, job="50"), mark("checkpoint", 1, 90, 10), end(1, 100, 20, "finished")]
    )
    assert s.clean and s.restarts == [] and s.by_cause == {} and s.steps_redone == 0
    assert s.last == "finished" and s.job_ids == ["50"]


def test_a_signal_restart_redoes_nothing_and_loses_the_time_down():
    rows = [
        start(1, 0, job="50"),
        mark("checkpoint", 1, 100, 10),
        mark("checkpoint", 1, 200, 17),  # the save on the signal
        end(1, 201, 17, "signal", signal="SIGUSR1"),
        start(2, 260, step=17, job="53"),  # 60 s after the save: queue, start-up, loading
        end(2, 400, 30, "finished"),
    ]
    s = summarise(rows)
    (r,) = s.restarts
    assert (r.cause, r.why, r.reached, r.resumed_step) == ("signal", "SIGUSR1", 17, 17)
    assert r.steps_redone == 0 and not r.at_least and r.lost_s == pytest.approx(60.0)
    assert s.by_cause == {"signal SIGUSR1": 1} and s.job_ids == ["50", "53"]
    assert s.last == "finished"


def test_a_killed_attempt_is_the_one_without_an_end_line():
    rows = [
        start(1, 0),
        mark("checkpoint", 1, 100, 10),
        mark("progress", 1, 160, 14),  # then SIGKILL: no end line
        start(2, 190, step=10),
        end(2, 300, 20, "finished"),
    ]
    (r,) = summarise(rows).restarts
    assert (r.cause, r.why, r.reached, r.steps_redone, r.at_least) == ("killed", None, 14, 4, True)
    assert r.lost_s == pytest.approx(90.0)  # from the checkpoint of step 10 to the restart


def test_an_attempt_killed_before_its_first_checkpoint_loses_all_of_it():
    rows = [start(1, 0), mark("progress", 1, 60, 5), start(2, 100), end(2, 200, 8, "finished")]
    (r,) = summarise(rows).restarts
    assert r.resumed_step == 0 and r.steps_redone == 5 and r.lost_s == pytest.approx(100.0)


def test_an_error_is_counted_by_its_type_and_several_restarts_add_up():
    rows = [
        start(1, 0, job="7"),
        mark("checkpoint", 1, 50, 5),
        end(1, 70, 6, "error", error="CheckpointDiskFull: no space for step_000006"),
        start(2, 100, step=5, job="8"),
        mark("checkpoint", 2, 150, 10),
        end(2, 151, 10, "signal", signal="SIGTERM"),
        start(3, 181, step=10, job="9"),
    ]
    s = summarise(rows)
    assert [(r.cause, r.why) for r in s.restarts] == [
        ("error", "CheckpointDiskFull"),
        ("signal", "SIGTERM"),
    ]
    assert s.by_cause == {"error CheckpointDiskFull": 1, "signal SIGTERM": 1}
    assert s.steps_redone == 1 and s.lost_s == pytest.approx(50.0 + 31.0)
    assert s.last == "running or killed" and s.job_ids == ["7", "8", "9"]


def test_the_resumed_state_is_found_in_an_earlier_attempt():
    """Attempt 2 is killed before it saves: attempt 3 resumes attempt 1's checkpoint again."""
    rows = [
        start(1, 0),
        mark("checkpoint", 1, 100, 10),
        end(1, 101, 10, "signal", signal="SIGUSR1"),
        start(2, 130, step=10),
        mark("progress", 2, 200, 13),
        start(3, 250, step=10),
    ]
    first, second = summarise(rows).restarts
    assert first.lost_s == pytest.approx(30.0)
    assert second.steps_redone == 3 and second.lost_s == pytest.approx(120.0)  # since 2's start


def test_a_state_not_in_the_history_leaves_the_loss_unknown():
    rows = [start(1, 0), end(1, 50, 4, "error", error="OSError: x"), start(2, 80, step=4)]
    s = summarise(rows)
    assert s.restarts[0].lost_s is None and s.lost_unknown == 1 and s.lost_s == 0


def test_a_fresh_start_or_other_settings_start_a_new_history():
    rows = [
        start(1, 0),
        end(1, 10, 3, "signal", signal="SIGUSR1"),
        start(2, 20, step=3),
        end(2, 30, 8, "finished"),
        start(3, 40, fresh_start=True),  # --fresh-start: the same settings, from scratch
        end(3, 50, 8, "finished"),
    ]
    s = summarise(rows)
    assert s.clean and len(s.attempts) == 1 and s.earlier == 2
    other = rows[:4] + [start(3, 40, settings_hash="other"), end(3, 50, 8, "finished")]
    s = summarise(other)
    assert s.clean and len(s.attempts) == 1 and s.earlier == 2


def test_an_attempt_after_a_finished_one_is_a_rerun_not_a_restart():
    rows = [
        start(1, 0),
        end(1, 10, 8, "finished"),
        start(2, 99, step=8),
        end(2, 100, 8, "finished"),
    ]
    s = summarise(rows)
    assert s.clean and s.reruns == 1 and len(s.attempts) == 2


def test_a_rerun_past_a_broken_final_checkpoint_is_said_with_the_steps_redone():
    """Finished at step 24 (checkpoints 8, 16, 24); the rerun found step 24's broken and resumed
    from 16: a rerun, and 8 steps redone from an older checkpoint than the newest saved."""
    rows = [start(1, 0), mark("checkpoint", 1, 5, 8), mark("checkpoint", 1, 9, 16)]
    rows += [mark("checkpoint", 1, 12, 24), end(1, 12, 24, "finished")]
    rows += [start(2, 99, step=16), mark("checkpoint", 2, 104, 24), end(2, 104, 24, "finished")]
    s = summarise(rows)
    assert s.reruns == 1 and s.clean
    (skip,) = s.skipped
    assert (skip.attempt, skip.resumed_step, skip.newest, skip.steps_redone) == (2, 16, 24, 8)
    assert str(skip) == (
        "attempt 2 resumed from step 16, not from the newer checkpoint of step 24 (unusable:"
        " broken or gone): 8 step(s) redone"
    )
    # resuming from the newest is no skip, whatever came before
    clean = [start(1, 0), mark("checkpoint", 1, 5, 8), end(1, 6, 9, "signal", signal="SIGUSR1")]
    assert summarise([*clean, start(2, 20, step=8), end(2, 30, 12, "finished")]).skipped == []


def test_a_torn_last_line_is_skipped_and_a_broken_one_elsewhere_named(tmp_path):
    rows = [start(1, 0), mark("checkpoint", 1, 10, 4)]
    path = write(tmp_path / "attempts.jsonl", rows, tail='{"event": "progr')
    assert read_attempts(path) == rows
    assert summarise(read_attempts(path)).attempts[0].reached == 4
    write(path, [rows[0]], tail='{"event": "progr\n' + json.dumps(rows[1]) + "\n")
    with pytest.raises(ValueError, match=r"attempts\.jsonl:2: not valid JSON"):
        read_attempts(path)
    assert read_attempts(tmp_path / "none.jsonl") == [] and summarise([]) is None


# ---- the writer -------------------------------------------------------------------------------


def test_the_writer_numbers_attempts_and_records_how_each_ended(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "50")
    first = AttemptLog(tmp_path, enabled=True)
    first.start(0, None, world_size=2, settings_hash="h", fresh_start=False)
    first.stepped(1)
    first.saved(1)
    first.end("signal", signal="SIGUSR1")
    first.end("error", error="late")  # once only
    monkeypatch.setenv("SLURM_JOB_ID", "53")
    second = AttemptLog(tmp_path, enabled=True)
    second.start(1, tmp_path / "checkpoints" / "step_000001", 2, "h", False)
    second.stepped(2)
    second.end("finished")
    AttemptLog(tmp_path, enabled=False).start(0, None, 2, "h", False)  # rank 1: nothing

    rows = read_attempts(tmp_path / "attempts.jsonl")
    assert [(r["event"], r["attempt"]) for r in rows] == [
        ("start", 1), ("checkpoint", 1), ("end", 1), ("start", 2), ("end", 2)
    ]  # fmt: skip
    assert rows[3]["checkpoint"] == "step_000001" and rows[3]["resumed_step"] == 1
    assert rows[2] == rows[2] | {"step": 1, "how": "signal", "signal": "SIGUSR1"}
    assert rows[4]["step"] == 2 and rows[4]["how"] == "finished"
    assert {"host", "world_size", "settings_hash", "fresh_start"} <= set(rows[0])
    s = summarise(rows)
    assert s.job_ids == ["50", "53"] and s.by_cause == {"signal SIGUSR1": 1}


def test_progress_lines_at_most_every_progress_interval(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(writer.time, "monotonic", lambda: clock[0])
    log = AttemptLog(tmp_path, enabled=True)
    log.start(0, None, 1, "h", False)
    for step in range(1, 6):  # 25 s a step: a line once 60 s have passed since the last
        clock[0] += 25
        log.stepped(step)
    steps = [r["step"] for r in read_attempts(log.path) if r["event"] == "progress"]
    assert steps == [3]  # 75 s after the start; step 5 is 50 s after it


def test_a_torn_tail_is_cut_before_the_next_attempt_appends(tmp_path, caplog):
    path = write(tmp_path / "attempts.jsonl", [start(1, 0)], tail='{"event": "progr')
    AttemptLog(tmp_path, enabled=True).start(3, None, 1, "h", False)
    rows = read_attempts(path)  # every line whole: the new start did not join the torn one
    assert [(r["event"], r["attempt"]) for r in rows] == [("start", 1), ("start", 2)]
    assert "dropping a torn last line" in caplog.text


def test_an_error_is_its_type_and_the_first_line_of_its_message_cut_short():
    assert short_error(ValueError("bad\nmore")) == "ValueError: bad"
    assert short_error(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert len(short_error(RuntimeError("x" * 500))) == writer.ERROR_CHARS
