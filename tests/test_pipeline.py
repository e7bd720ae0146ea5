"""The whole DAG for real: the embedded default end to end, then Snakemake's own plan for each of
the four caching cases (nothing changed, a training, an evaluation and a dataset setting changed).

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
from lmpipe.report import flatten

pytestmark = pytest.mark.slow

REPORT = "embedded"
EVAL_RULES = ("evaluate_loss", "evaluate_hellaswag", "sample")

# The demo's runs, made smaller so that the module takes minutes, not tens, on 2 shared cores:
# pretraining 12 steps instead of 40, fine-tuning 1 epoch instead of 3, 20 HellaSwag items instead
# of 100, 8K val tokens instead of 32K. Everything else (2 FSDP ranks, lm-eval, the runs and their
# differences) is the demo's.
SMALLER_TRAIN = {"max_steps": 12, "warmup_steps": 2, "val_every": 6, "checkpoint_every": 6}
SMALLER_SFT = {"epochs": 1}
SMALLER_EVAL = {"val_tokens": 8192, "hellaswag_items": 20, "sample_tokens": 16}
STEPS = SMALLER_TRAIN["max_steps"]


def smaller_demo_config(workdir: Path) -> None:
    """Shrink the runs of the copy's embedded report in config/config.yaml, in place."""
    path = workdir / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    for run in config["reports"][REPORT]["runs"]:
        r = config["runs"][run]
        r.setdefault("eval", {}).update(SMALLER_EVAL)
        if "sft" in r:
            r["sft"].update(SMALLER_SFT)
        else:
            r["train"].update(SMALLER_TRAIN)
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
    """(rule, wildcards) of every job a dry run plans, with `config` given as --configfile."""
    args = ["-n"]
    if config is not None:
        path = workdir / f"changed_{len(list(workdir.glob('changed_*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(config))
        args += ["--configfile", str(path)]
    out = snakemake(workdir, *args).stdout
    # each planned job: a "rule NAME:" line, then its indented details ("wildcards: run=...")
    jobs = set()
    for rule, details in re.findall(r"^(?:local)?rule (\w+):\n((?:[ \t]+.*\n?)*)", out, re.M):
        if rule != "all":
            wc = re.search(r"^\s*wildcards: \w+=(\S+)", details, re.M)
            jobs.add((rule, wc.group(1) if wc else ""))
    return jobs


def base_config(workdir: Path) -> dict:
    """The copy's config as Snakemake sees it (schema defaults filled in)."""
    return lmconfig.load_config(workdir / "config" / "config.yaml")


def report_runs(config: dict) -> list[str]:
    return config["reports"][REPORT]["runs"]


def fine_tunings_of(config: dict, run: str) -> list[str]:
    return [r for r in report_runs(config) if config["runs"][r].get("base", {}).get("run") == run]


def jobs_of(config: dict, run: str, *, retrained: bool) -> set[tuple[str, str]]:
    """The jobs of one run: its evaluations, and its training and conversion when `retrained`."""
    rules = list(EVAL_RULES)
    if lmconfig.run_config(config, run).eval.lm_eval:
        rules.append("evaluate_lm_eval")
    if lmconfig.chat_dataset(config, run):  # a fine-tuning run or the base of one
        rules += ["evaluate_sft_loss", "chat_samples"]
    if retrained:
        rules += ["sft" if lmconfig.is_sft(config, run) else "train", "convert"]
    return {(rule, run) for rule in rules}


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
        assert samples and all(len(s["completion"]) > 0 for s in samples)
        if not lmconfig.is_sft(config, run):
            meta = json.loads((built / "results/runs" / run / "train/final/meta.json").read_text())
            assert meta["tokens"] == STEPS * 4096
            assert f"{STEPS * 4096 / 1000:.3g}K" in row  # tokens trained
    # the settings the runs differ in (pretraining runs: lr only), and only those, highlighted
    params = json.loads(lmconfig.report_params(config, REPORT))["runs"]
    flat = [flatten({k: v for k, v in p.items() if k != "run"}) for p in params.values()]
    differing = sorted(
        k for k in set().union(*flat) if len({json.dumps(f.get(k)) for f in flat}) > 1
    )
    highlighted = re.findall(r'<tr class="diff">\s*<td><code>([^<]+)</code>', html)
    assert "train.lr" in highlighted
    assert highlighted == differing
    assert html.count("<img ") >= 3 and "data:image/png;base64," in html


def test_nothing_changed_nothing_to_do(built: Path) -> None:
    assert planned_jobs(built) == set()
    assert "Nothing to be done" in snakemake(built, "-n").stdout


def test_training_setting_reruns_that_run_and_the_report(built: Path) -> None:
    """embedded-a: its own jobs, its fine-tunings' (they start from its weights), the report."""
    config = base_config(built)
    config["runs"]["embedded-a"]["train"]["lr"] = 2.0e-3
    expected = jobs_of(config, "embedded-a", retrained=True) | {("report", REPORT)}
    for child in fine_tunings_of(config, "embedded-a"):
        expected |= jobs_of(config, child, retrained=True)
    assert ("train", "embedded-b") not in expected
    assert planned_jobs(built, config) == expected


def test_evaluation_setting_reruns_only_evaluate_and_report(built: Path) -> None:
    config = base_config(built)
    config["runs"]["embedded-b"]["eval"]["sample_tokens"] = 24  # 16 in SMALLER_EVAL
    expected = jobs_of(config, "embedded-b", retrained=False) | {("report", REPORT)}
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
