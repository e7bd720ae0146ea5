"""lmpipe.stale.find on plain jobs and real files: which producers are forced, and why.

The whole mechanism, hooked into Snakemake's DAG, is tested for real in tests/test_pipeline.py
(each kind of the demo's outputs deleted, then a plain rerun).
"""

from __future__ import annotations

import json
from pathlib import Path

from lmpipe.stale import Job, find, half_written

# download -> tokenize -> train -> convert -> evaluate -> report, as paths in a folder
CHAIN = ["raw.json", "tokens.json", "final", "hf", "eval.json", "report.html"]


def chain_jobs(root: Path) -> list[Job]:
    paths = [str(root / p) for p in CHAIN]
    jobs = [Job("download", (paths[0],), ())]
    jobs += [Job(f"job{i}", (paths[i],), (paths[i - 1],)) for i in range(1, len(paths))]
    return jobs


def make_all(root: Path) -> None:
    for name in CHAIN:
        path = root / name
        if "." in name:
            path.write_text("{}")
        else:
            path.mkdir()
            (path / "weights").write_text("w")


def test_nothing_missing_nothing_forced(tmp_path):
    make_all(tmp_path)
    assert find(chain_jobs(tmp_path)) == []


def test_a_missing_file_under_a_present_reader_forces_its_producer(tmp_path):
    make_all(tmp_path)
    (tmp_path / "eval.json").unlink()
    [repair] = find(chain_jobs(tmp_path))
    assert repair.job.name == "job4" and repair.path == str(tmp_path / "eval.json")
    assert [r.name for r in repair.readers] == ["job5"]
    assert "report.html, which reads it, is on disk: job4 rebuilds it" in repair.line()


def test_a_missing_file_whose_readers_are_missing_too_is_left_to_snakemake(tmp_path):
    """Removed together with everything after it: Snakemake's own plan already rebuilds it
    when a target needs it; nothing is stale."""
    make_all(tmp_path)
    for name in ("eval.json", "report.html"):
        (tmp_path / name).unlink()
    assert find(chain_jobs(tmp_path)) == []


def test_each_missing_link_with_a_present_reader_is_found(tmp_path):
    """The final checkpoint and the converted folder both gone: the evaluation that reads the
    folder is on disk, so the folder is rebuilt; the checkpoint's reader (convert) is not on
    disk, and Snakemake rebuilds the checkpoint for it."""
    import shutil

    make_all(tmp_path)
    for name in ("final", "hf"):
        shutil.rmtree(tmp_path / name)
    assert [r.job.name for r in find(chain_jobs(tmp_path))] == ["job3"]


def test_a_temporary_file_removed_once_read_is_not_missing(tmp_path):
    """Snakemake's temp(): a dataset's tokenized parts, removed once the shards are cut."""
    make_all(tmp_path)
    part = str(tmp_path / "part_0.bin")
    tokens = str(tmp_path / "tokens.json")
    jobs = [
        Job("tokenize_part", (part,), (), temporary=frozenset({part})),
        Job("tokenize", (tokens,), (part,)),
    ]
    assert find(jobs) == []


def test_a_file_no_job_makes_is_not_ours_to_rebuild(tmp_path):
    """A source file (the config's parquet) missing is Snakemake's MissingInputException."""
    make_all(tmp_path)
    jobs = [Job("download", (str(tmp_path / "raw.json"),), (str(tmp_path / "source.parquet"),))]
    assert find(jobs) == []


def test_a_manifest_missing_a_listed_shard_is_half_written(tmp_path):
    make_all(tmp_path)
    manifest = tmp_path / "manifest.json"
    shards = [{"file": "a_val_000000.bin"}, {"file": "a_train_000001.bin"}]
    manifest.write_text(json.dumps({"shards": shards}))
    (tmp_path / "a_val_000000.bin").write_bytes(b"x")
    assert (
        half_written(str(manifest))
        == "half-written (a_train_000001.bin, which it lists, is missing)"
    )
    (tmp_path / "a_train_000001.bin").write_bytes(b"x")
    assert half_written(str(manifest)) is None
    jobs = [
        Job("tokenize", (str(manifest),), ()),
        Job("train", (str(tmp_path / "final"),), (str(manifest),)),
    ]
    (tmp_path / "a_train_000001.bin").unlink()
    [repair] = find(jobs)
    assert repair.job.name == "tokenize" and repair.readers == ()
    assert repair.line().endswith("is half-written (a_train_000001.bin, which it lists, is missing)"
                                  ": tokenize rebuilds it, then what reads it reruns")  # fmt: skip


def test_the_suites_task_folders_and_empty_output_folders(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"tasks": {"piqa": {"folder": "piqa", "items": 3}}}))
    assert "piqa, which it lists, is missing" in half_written(str(manifest))
    (tmp_path / "piqa").mkdir()
    assert half_written(str(manifest)) is None
    (tmp_path / "hf").mkdir()
    assert half_written(str(tmp_path / "hf")) == "an empty folder"
    (tmp_path / "broken" / "manifest.json").parent.mkdir()
    (tmp_path / "broken" / "manifest.json").write_text('{"shards": [')
    assert half_written(str(tmp_path / "broken" / "manifest.json")) == "not readable JSON"
    assert half_written(str(tmp_path / "report.html")) is None  # not a manifest: not looked into
