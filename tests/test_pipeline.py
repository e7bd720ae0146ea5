"""The whole DAG for real: the embedded default end to end, then Snakemake's own plan for each of
the caching cases (nothing changed; a training, an evaluation, one HellaSwag setting and a
dataset setting changed).

One real run (`snakemake --cores 2`, the demo command, in a fresh copy of the workflow whose
embedded runs are made smaller: see SMALLER_*), then only dry runs (`-n`, default rerun triggers)
against its metadata, so the whole module costs one small demo run.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from conftest import make_workdir, snakemake
from lmpipe import config as lmconfig
from lmpipe import schema

pytestmark = pytest.mark.slow

REPORT = "embedded"

# The demo's runs, made smaller so that the module takes minutes, not tens, on 2 shared cores:
# pretraining 12 steps instead of 24, 20 HellaSwag items instead of 100, 8K val tokens instead
# of 32K. Everything else (2 FSDP ranks, lm-eval, the runs and their differences, the fine-tuning's
# 10 epochs, which teach it the data's identity) is the demo's.
SMALLER_TRAIN = {"max_steps": 12, "val_every": 6, "checkpoint_every": 6}
SMALLER_EVAL = {"val_loss": {"tokens": 8192}, "hellaswag": {"items": 20}, "samples": {"tokens": 16}}
STEPS = SMALLER_TRAIN["max_steps"]


def smaller_demo_config(workdir: Path) -> None:
    """Shrink the runs of the copy's embedded report in config/config.yaml, in place."""
    path = workdir / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    for run in config["reports"][REPORT]["runs"]:
        r = config["runs"][run]
        for section, smaller in SMALLER_EVAL.items():
            r.setdefault("eval", {}).setdefault(section, {}).update(smaller)
        if "sft" not in r:
            r["train"].update(SMALLER_TRAIN)
            r["train"]["schedule"] = {"warmup_steps": 2}
    path.write_text(yaml.safe_dump(config, sort_keys=False))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh copy of the workflow after the demo command has built the default target."""
    workdir = make_workdir(tmp_path_factory.mktemp("e2e"))
    smaller_demo_config(workdir)
    start = time.monotonic()
    proc = snakemake(workdir, "--cores", "2")
    elapsed = time.monotonic() - start
    print(f"\nsnakemake --cores 2 (the embedded default) took {elapsed:.0f} s")
    log = proc.stdout + proc.stderr
    # the demo ends with the report: it is the last job before the `all` target
    finished = re.findall(r"\(Rule: (\w+)", log) or re.findall(r"^rule (\w+):", log, re.M)
    assert [r for r in finished if r != "all"][-1] == "report", log[-3000:]
    return workdir


def planned_jobs(workdir: Path, config: dict | None = None) -> set[tuple[str, str]]:
    """(rule, its wildcards' values joined by "/") of every job a dry run plans, with `config`
    given as --configfile: ("train", "embedded-a"), ("evaluate", "embedded-a/hellaswag")."""
    return dry_run(workdir, config)[0]


def dry_run(workdir: Path, config: dict | None = None) -> tuple[set[tuple[str, str]], str]:
    """The jobs a dry run plans (planned_jobs) and its console output."""
    args = ["-n"]
    if config is not None:
        path = workdir / f"changed_{len(list(workdir.glob('changed_*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(config))
        args += ["--configfile", str(path)]
    proc = snakemake(workdir, *args)
    out = proc.stdout
    # each planned job: a "rule NAME:" line, then its indented details ("wildcards: run=...")
    jobs = set()
    for rule, details in re.findall(r"^(?:local)?rule (\w+):\n((?:[ \t]+.*\n?)*)", out, re.M):
        if rule != "all":
            wc = re.search(r"^\s*wildcards: (.*)$", details, re.M)
            values = re.findall(r"\w+=([^,\s]+)", wc.group(1)) if wc else []
            jobs.add((rule, "/".join(values)))
    return jobs, proc.stdout + proc.stderr


def base_config(workdir: Path) -> dict:
    """The copy's config as Snakemake sees it (schema defaults filled in)."""
    return schema.load_config(workdir / "config" / "config.yaml")


def report_runs(config: dict) -> list[str]:
    return config["reports"][REPORT]["runs"]


def fine_tunings_of(config: dict, run: str) -> list[str]:
    return [r for r in report_runs(config) if config["runs"][r].get("base", {}).get("run") == run]


def jobs_of(config: dict, run: str, *, retrained: bool) -> set[tuple[str, str]]:
    """The jobs of one run: its evaluations, and its training and conversion when `retrained`."""
    jobs = {("evaluate", f"{run}/{e}") for e in lmconfig.evaluations_of(config, run)}
    if retrained:  # GPT-2 runs: the llm.c file too
        jobs |= {("train", run), ("convert", run), ("export_llmc", run)}
    return jobs


def row_text(html: str, row_id: str) -> str:
    m = re.search(rf'<tr id="{re.escape(row_id)}">(.*?)</tr>', html, re.S)
    assert m, f"no row {row_id} in the report"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", m.group(1)))


def test_report_holds_every_runs_metrics_and_the_differences(built: Path) -> None:
    html = (built / "results" / f"report_{REPORT}.html").read_text()
    config = base_config(built)
    for run in report_runs(config):
        row = row_text(html, f"headline-{run}")
        assert "finished" in row and "not finished" not in row, row
        ev = built / "results" / "runs" / run / "eval"
        val_loss = json.loads((ev / "val_loss.json").read_text())["value"]
        assert f"{val_loss:,.4f}" in row, (val_loss, row)
        for name in ("hellaswag", "hellaswag_lm_eval"):
            if (ev / f"{name}.json").exists():
                result = json.loads((ev / f"{name}.json").read_text())
                acc_norm = result.get("acc_norm", result["value"])
                assert f"{100 * acc_norm:.2f}%" in row, (name, acc_norm, row)
        samples = json.loads((ev / "samples.json").read_text())["samples"]
        assert samples and any(s["completion"] for s in samples)  # (one may end at once)
        if not lmconfig.is_fine_tuning(config, run):
            meta = json.loads((built / "results/runs" / run / "train/final/meta.json").read_text())
            assert meta["tokens"] == STEPS * 4096
            assert f"{STEPS * 4096 / 1000:.3g}K" in row  # tokens trained
    # the one setting the two pretraining runs differ in, and only it, is the comparison; the
    # fine-tuning run's own data, steps and lr are marked as the kind of run
    highlighted = re.findall(r'<tr class="diff">\s*<td><code>([^<]+)</code>', html)
    assert highlighted == ["train.optimizer.lr"]
    kind = re.findall(r'<tr class="kind">\s*<td><code>([^<]+)</code>', html)
    assert {"dataset", "sft.epochs", "train.max_steps"} <= set(kind)
    # what the fine-tuning run used, not the 0 its config leaves to the epochs
    meta = json.loads((built / "results/runs/embedded-a-chat/train/final/meta.json").read_text())
    row = re.search(r"<code>train\.max_steps</code>.*?</tr>", html, re.S).group(0)
    assert re.findall(r"<td>([^<]*)</td>", row) == ["12", "12", str(meta["step"])]
    assert meta["step"] > 0
    assert html.count("<img ") >= 3 and "data:image/png;base64," in html
    # the verdict: embedded-b's val loss against embedded-a's, over the val documents both
    # scored, said to be one seed each
    verdict = re.search(r'<ul id="findings">(.*?)</ul>', html, re.S).group(1)
    said = r"embedded-b: FineWeb val loss [\d.]+ against embedded-a(?:'|&#39;)s [\d.]+ \("
    assert re.search(said, verdict), verdict
    said = r"over \d+ documents, cluster-robust; evaluation noise only, one seed each; differs"
    assert re.search(said + r" in train\.optimizer\.lr; [\d,]+ tokens trained each\)", verdict)


def test_the_fine_tuned_run_answers_with_the_vicuna_identity(built: Path) -> None:
    """The demo's chat fine-tuning (10 epochs of the Vicuna identity conversations) teaches the
    data's identity, which its base never says."""
    chat, base = (built / f"results/runs/{run}/eval" for run in ("embedded-a-chat", "embedded-a"))
    loss = {d: json.loads((d / "sft_loss.json").read_text())["value"] for d in (chat, base)}
    assert loss[chat] < 0.1 * loss[base], loss  # far below: measured 0.08 vs 8.9
    samples = json.loads((chat / "chat_samples.json").read_text())["samples"]
    # "Vicuna, a language model trained by researchers from Large Model Systems Organization
    # (LMSYS)", in one of its phrasings, for the question the issue asks
    who = next(s["reply"] for s in samples if s["prompt"] == "Who are you?")
    assert "Vicuna" in who and "LMSYS" in who, samples
    base_samples = json.loads((base / "chat_samples.json").read_text())["samples"]
    assert not any(w in s["reply"] for s in base_samples for w in ("Vicuna", "LMSYS"))
    log = (built / "results/logs/train/embedded-a-chat.log").read_text()
    assert "resumed from" not in log and "embedded-a-chat" in log


def test_the_fine_tuned_run_keeps_its_pretraining(built: Path) -> None:
    """The demo's chat fine-tuning replays its base's FineWeb text (sft.replay): its FineWeb val
    loss stays at its base's or below, far under an untrained model's ln(50,257) = 10.82 (10
    epochs of the conversations alone took it to 15.9), and the report's verdict says nothing
    of lost pretraining."""
    val = {
        run: json.loads((built / f"results/runs/{run}/eval/val_loss.json").read_text())["value"]
        for run in ("embedded-a-chat", "embedded-a")
    }
    assert val["embedded-a-chat"] < min(val["embedded-a"] + 0.1, 10.82), val
    html = (built / "results" / f"report_{REPORT}.html").read_text()
    verdict = re.search(r'<ul id="findings">(.*?)</ul>', html, re.S).group(1)
    assert "lost its pretraining" not in verdict, verdict
    metrics = (built / "results/runs/embedded-a-chat/train/metrics.jsonl").read_text()
    last = [json.loads(line) for line in metrics.splitlines() if '"loss"' in line][-1]
    assert last["tokens_by_source"]["embedded"] > 0  # it read the base's text


def test_a_replay_setting_reruns_that_fine_tuning_only(built: Path) -> None:
    """sft.replay of embedded-a-chat: its training, conversion and evaluations, and the report;
    not its base's nor embedded-b's."""
    config = base_config(built)
    config["runs"]["embedded-a-chat"]["sft"]["replay"] = 0.5
    expected = jobs_of(config, "embedded-a-chat", retrained=True) | {("report", REPORT)}
    assert planned_jobs(built, config) == expected


def test_nothing_changed_nothing_to_do(built: Path) -> None:
    assert planned_jobs(built) == set()
    assert "Nothing to be done" in snakemake(built, "-n").stdout


def test_training_setting_reruns_that_run_and_the_report(built: Path) -> None:
    """embedded-a: its own jobs, its fine-tunings' (they start from its weights), the report."""
    config = base_config(built)
    config["runs"]["embedded-a"]["train"]["optimizer"]["lr"] = 2.0e-3
    expected = jobs_of(config, "embedded-a", retrained=True) | {("report", REPORT)}
    for child in fine_tunings_of(config, "embedded-a"):
        expected |= jobs_of(config, child, retrained=True)
    assert ("train", "embedded-b") not in expected
    assert planned_jobs(built, config) == expected


def test_evaluation_setting_reruns_only_evaluate_and_report(built: Path) -> None:
    config = base_config(built)
    config["runs"]["embedded-b"]["eval"]["samples"]["tokens"] = 24  # 16 in SMALLER_EVAL
    assert planned_jobs(built, config) == {("evaluate", "embedded-b/samples"), ("report", REPORT)}


def test_hellaswag_items_reruns_the_hellaswag_evaluations_only(built: Path) -> None:
    """Not the val loss, not the samples, not another run's: both HellaSwag scorings, and the
    report."""
    config = base_config(built)
    config["runs"]["embedded-a"]["eval"]["hellaswag"]["items"] = 10  # 20 in SMALLER_EVAL
    expected = {
        ("evaluate", "embedded-a/hellaswag"),
        ("evaluate", "embedded-a/hellaswag_lm_eval"),
        ("report", REPORT),
    }
    assert planned_jobs(built, config) == expected


def test_a_schedule_during_training_reruns_that_training(built: Path) -> None:
    """eval.hellaswag.during_training of embedded-b: its train job (which resumes its
    checkpoint: the trajectory's hash leaves the schedule out) and what follows it; not its
    offline HellaSwag settings' own change, which the test above holds to the evaluations."""
    config = base_config(built)
    hellaswag = config["runs"]["embedded-b"]["eval"]["hellaswag"]
    # a new mapping: the YAML alias gives embedded-a and embedded-b one and the same
    hellaswag["during_training"] = hellaswag["during_training"] | {"every": 4}
    expected = jobs_of(config, "embedded-b", retrained=True) | {("report", REPORT)}
    assert planned_jobs(built, config) == expected


def test_dataset_setting_reruns_everything_downstream(built: Path) -> None:
    """Re-sharding the text: tokenize, then every run trained or measured on it; not download,
    nor the chat data (its own dataset)."""
    config = base_config(built)
    config["datasets"]["embedded"]["shard_tokens"] = 400_000
    expected = {("tokenize", "embedded"), ("report", REPORT)}
    for run in report_runs(config):
        if lmconfig.text_dataset(config, run) == "embedded":
            expected |= jobs_of(config, run, retrained=True)
    planned = planned_jobs(built, config)
    assert ("download", "embedded") not in planned  # the raw text does not depend on sharding
    assert planned == expected


def test_a_failed_evaluation_is_rebuilt_by_the_default_target_with_the_report(built: Path) -> None:
    """A real failure (a forced val-loss evaluation on a truncated val shard: Snakemake removes
    its output), then a real rerun of the default target once the shard is whole again: the
    evaluation and the report run again, so the report is not left stale. (Snakemake alone would
    plan nothing: it does not rebuild a removed file whose reader is present, snakemake#1978.)"""
    shard = built / "results/data/embedded/tokens/embedded_val_000000.bin"
    result = built / "results/runs/embedded-a/eval/val_loss.json"
    report = built / f"results/report_{REPORT}.html"
    good, before = shard.read_bytes(), report.stat().st_mtime
    shard.write_bytes(good[:-4000])
    try:
        forced = str(result.relative_to(built))
        failed = snakemake(built, "--cores", "2", "--forcerun", forced, check=False)
    finally:
        shard.write_bytes(good)
    assert failed.returncode != 0 and not result.exists()
    assert "truncated or corrupt" in failed.stdout + failed.stderr  # said on the console
    assert {("evaluate", "embedded-a/val_loss"), ("report", REPORT)} <= planned_jobs(built)
    rerun = snakemake(built, "--cores", "2")
    said = f"lmpipe: {forced} is missing, and results/report_{REPORT}.html, which reads it, is on"
    assert said in rerun.stdout + rerun.stderr
    assert result.exists() and report.stat().st_mtime > before
    assert planned_jobs(built) == set()


# ---- never stale: an output removed by hand (or by a scratch purge) under a present reader ----


def downstream_of_deleting(config: dict, kind: str) -> set[tuple[str, str]]:
    """The jobs a plain run must plan once the demo's output of `kind` is removed: the job that
    makes it and every job after it, written out from the demo's DAG (docs/architecture.md)."""
    report = {("report", REPORT)}
    if kind == "tokens manifest":  # the text's shards: every run on them, trained again
        jobs = {("tokenize", "embedded")} | report
        for run in report_runs(config):
            if lmconfig.text_dataset(config, run) == "embedded":
                jobs |= jobs_of(config, run, retrained=True)
        return jobs
    if kind == "train/final":  # embedded-b: no fine-tuning starts from it
        return jobs_of(config, "embedded-b", retrained=True) | report
    if kind == "model/hf":  # embedded-a's evaluations read it; its fine-tuning reads train/final
        evals = jobs_of(config, "embedded-a", retrained=False)
        return {("convert", "embedded-a")} | evals | report
    if kind == "llmc.bin":  # only the report reads llm.c's file
        return {("export_llmc", "embedded-a")} | report
    if kind == "evaluation file":
        return {("evaluate", "embedded-b/suite")} | report
    raise KeyError(kind)


DELETED = {
    "tokens manifest": "results/data/embedded/tokens/manifest.json",
    "train/final": "results/runs/embedded-b/train/final",
    "model/hf": "results/runs/embedded-a/model/hf",
    "llmc.bin": "results/runs/embedded-a/model/llmc.bin",
    "evaluation file": "results/runs/embedded-b/eval/suite.json",
}


def dry_run_without(workdir: Path, path: Path) -> tuple[set[tuple[str, str]], str]:
    """A dry run with `path` moved aside, then put back (its mtime kept): what it plans."""
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    try:
        return dry_run(workdir)
    finally:
        aside.rename(path)


@pytest.mark.parametrize("kind", list(DELETED))
def test_a_deleted_output_is_rebuilt_with_what_reads_it(built: Path, kind: str) -> None:
    """Each kind of the demo's outputs removed (moved aside, then back): a plain run plans
    exactly the job that makes it and what follows, and says so in one line."""
    planned, console = dry_run_without(built, built / DELETED[kind])
    assert "Nothing to be done" not in console
    said = [line for line in console.splitlines() if "lmpipe: " in line]
    assert len(said) == 1 and f"lmpipe: {DELETED[kind]} is missing" in said[0], said
    assert planned == downstream_of_deleting(base_config(built), kind)
    assert planned_jobs(built) == set()  # back in place: up to date again


def test_a_half_written_tokens_folder_is_tokenized_again(built: Path) -> None:
    """A shard gone from under its manifest (a scratch purge takes files one by one):
    tokenize, and everything after it, as for a removed manifest."""
    shard = built / "results/data/embedded/tokens/embedded_train_000002.bin"
    planned, console = dry_run_without(built, shard)
    assert "embedded_train_000002.bin, which it lists, is missing" in console
    assert planned == downstream_of_deleting(base_config(built), "tokens manifest")


@pytest.mark.parametrize("kind", ["evaluation file", "llmc.bin", "train/final"])
def test_a_plain_rerun_rebuilds_a_deleted_output_and_a_fresh_report(built: Path, kind: str) -> None:
    """For real: the output comes back equal (a resumed training's final checkpoint evaluates
    to the same val loss), the jobs that read it ran again, and the report is rebuilt."""
    import shutil

    path = built / DELETED[kind]
    report = built / f"results/report_{REPORT}.html"
    run = path.relative_to(built / "results/runs").parts[0]
    val_loss = built / "results/runs" / run / "eval/val_loss.json"
    before = {"report": report.stat().st_mtime, "val_loss": json.loads(val_loss.read_text())}
    old = path.read_bytes() if path.is_file() else None
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    rerun = snakemake(built, "--cores", "2")
    log = rerun.stdout + rerun.stderr
    assert f"lmpipe: {DELETED[kind]} is missing" in log
    assert path.exists() and report.stat().st_mtime > before["report"]
    if old is not None and kind == "llmc.bin":
        assert path.read_bytes() == old  # the same checkpoint, the same llm.c file
    after = json.loads(val_loss.read_text())
    assert after["value"] == before["val_loss"]["value"]
    if kind == "train/final":  # resumed from its last checkpoint, not trained again
        train_log = (built / f"results/logs/train/{run}.log").read_text()
        assert "resumed from" in train_log, train_log[-2000:]
    assert planned_jobs(built) == set()
