"""The plan of a target (lmpipe.plan): every job of the 124M and 350M reports can finish; a job
that cannot is flagged; the rules ask for the resources the plan prints."""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import pytest
import yaml

from conftest import CONFIG_FILE, REPO, make_workdir, snakemake
from lmpipe import config as lmconfig
from lmpipe import costs, plan, schema
from lmpipe import resources as lmresources
from lmpipe.dag import DagJob, target_jobs
from lmpipe.registry import EVALUATIONS, Evaluation, SampleSettings, SuiteSettings
from lmpipe.throughputs import figure

# OpenAI's GPT-2 124M / 350M with the vocabulary padded to 50304 (llm.c's count), by hand
PARAMS = {"124m": 124_475_904, "350m": 354_871_296}


@pytest.fixture(scope="module")
def config() -> dict:
    return schema.load_config(CONFIG_FILE)


# the GPU presets: llm.c's 124M, 350M, 774M and 1558M runs and the 124M run on one GPU
GPU_REPORTS = ("124m", "350m", "774m", "1558m", "124m-1gpu")


@pytest.fixture(scope="module")
def dags(tmp_path_factory) -> dict[str, list[DagJob]]:
    """Snakemake's own jobs of each GPT-2 report (a dry run in a copy of the workflow)."""
    workdir = make_workdir(tmp_path_factory.mktemp("wf"))
    return {r: target_jobs(f"results/report_{r}.html", workdir=workdir) for r in GPU_REPORTS}


def jobs_of(config: dict, dag: list[DagJob], gpu: str | None = None) -> dict[str, costs.Job]:
    return {f"{j.rule} {j.name}".strip(): j for j in plan.cost_jobs(config, dag, gpu)}


@pytest.mark.parametrize("report", GPU_REPORTS)
def test_every_job_of_the_gpt2_reports_can_finish(config, dags, report):
    jobs = jobs_of(config, dags[report])
    assert [name for name, j in jobs.items() if j.problems] == []
    assert {"tokenize", "train", "convert", "evaluate", "report"} <= {j.rule for j in jobs.values()}
    train = jobs[f"train {report}"]
    launch = config["runs"][report]["launch"]
    gpus = launch["procs_per_node"]
    assert train.gpus == gpus and train.jobs_in_a_row <= costs.retries() + 1
    assert train.gpu_mem_gb < 80  # an 80 GB card's; the 124M issue's estimate was ~34 GB
    share = (1, launch["cpus_per_task"] // gpus, launch["mem_mb"] // gpus)
    for name, job in jobs.items():
        if job.rule in ("convert", "evaluate"):  # a GPU run's: one GPU, its share of the node
            assert (job.gpus, job.cpus, job.mem_mb) == share, name
        if job.limit_min is not None:
            assert job.estimate_s < job.limit_min * 60 * job.jobs_in_a_row, name


def test_the_train_estimate_is_the_flops_over_the_assumed_rate(config, dags):
    """124M on 8 A100s at the assumed 40% MFU: 10B tokens x (6N + 6LCT) FLOPs."""
    job = jobs_of(config, dags["124m"])["train 124m"]
    flops = 6 * PARAMS["124m"] + 6 * 12 * 768 * 1024
    compute = 19073 * 524288 * flops / (8 * 312e12 * 0.40)
    assert compute == pytest.approx(8000, rel=0.01)  # about 2.2 h
    assert compute < job.estimate_s < compute * 1.15  # plus validations, saves and the start
    # on H100s the same run is 989 / 312 times faster
    h100 = jobs_of(config, dags["124m"], "h100")["train 124m"]
    assert h100.estimate_s < job.estimate_s / 2.5
    assert "h100" in h100.basis


def test_a_short_time_limit_is_flagged(config, dags):
    short = copy.deepcopy(config)
    short["runs"]["124m"]["launch"]["runtime"] = 30  # 2.4 h of training in 30-minute jobs
    train = jobs_of(short, dags["124m"])["train 124m"]
    assert train.jobs_in_a_row > costs.retries() + 1
    assert train.problems and "jobs of 30 min in a row" in train.problems[0]
    # a partition that allows 2 minutes: the GPU evaluations cannot finish either
    tiny = copy.deepcopy(config)
    tiny["cluster"]["max_runtime"] = 2
    jobs = jobs_of(tiny, dags["124m"])
    flagged = {name for name, j in jobs.items() if j.problems}
    assert {"evaluate 124m/val_loss", "train 124m"} <= flagged
    assert "cluster.max_runtime" in jobs["evaluate 124m/val_loss"].problems[0]


def test_the_cli_prints_the_plan_and_fails_on_a_problem(tmp_path, capsys):
    assert plan.main(["results/report_124m.html", "--config", str(CONFIG_FILE)]) == 0
    out = capsys.readouterr().out
    assert "train 124m" in out and "every job fits its time limit" in out
    assert re.search(r"report 124m: \d+ jobs, [\d.]+ GPU-hours, .* about \$\d+", out)
    overlay = tmp_path / "short.yaml"
    overlay.write_text("runs:\n  124m:\n    launch: {runtime: 30}\n")
    args = ["results/report_124m.html", "--config", str(CONFIG_FILE), "--configfile", str(overlay)]
    assert plan.main(args) == 1
    assert "!! train 124m: needs" in capsys.readouterr().out


def test_the_rules_ask_for_what_the_plan_derives(tmp_path):
    """The SLURM dry run of the 124M report: tokenize gets a node's CPUs, convert and evaluate
    one GPU each with the plan's memory and time limit."""
    workdir = make_workdir(tmp_path / "wf")
    out = snakemake(workdir, "--profile", "slurm", "-n", "results/report_124m.html").stdout
    jobs = re.findall(r"^rule (\w+):\n((?:[ \t]+.*\n)*)", out, re.M)
    resources = {rule: [] for rule, _ in jobs}
    for rule, details in jobs:
        resources[rule].append(re.search(r"resources: (.*)", details).group(1))
    assert "--workers 64" in out
    config = schema.load_config(CONFIG_FILE)
    expected = lmresources.job_resources(config, "evaluate", "124m", "val_loss")
    assert expected["gres"] == "gpu:1"
    for rule in ("convert", "evaluate"):
        for line in resources[rule]:
            assert "gres=gpu:1" in line and "mem_mb=60000" in line, line
            assert re.search(r"runtime=(\d+)", line).group(1) == str(expected["runtime"])


def test_a_dataset_too_big_for_one_job_is_tokenized_in_parts(config, tmp_path):
    """With a 30-minute partition, sample-100BT's tokenizing (~40 min: 1e11 tokens at the ~4e7/s
    of a job's one thread that reads and writes) is split in two part jobs, then the shards are
    cut from their streams in a third."""
    short = copy.deepcopy(config)
    short["cluster"]["max_runtime"] = 30
    assert lmresources.tokenize_parts(config, "fineweb100B") == 1  # the 48-hour default: one job
    assert lmresources.tokenize_parts(short, "fineweb100B") == 2
    workdir = make_workdir(tmp_path / "wf")
    (workdir / "short.yaml").write_text("cluster: {max_runtime: 30}\n")
    files = [str(workdir / "config" / "config.yaml"), str(workdir / "short.yaml")]
    jobs = jobs_of(short, target_jobs("results/report_350m.html", files, workdir))
    # (Snakemake lists jobs of one level in no fixed order)
    assert sorted(n for n in jobs if n.startswith("tokenize")) == [
        "tokenize fineweb100B",
        "tokenize_part fineweb100B/000",
        "tokenize_part fineweb100B/001",
    ]
    assert not any(j.problems for n, j in jobs.items() if n.startswith("tokenize"))
    # what Snakemake plans: the two parts, and the shards cut from them
    target = "results/data/fineweb100B/tokens/manifest.json"
    configs = ["--configfile", "config/config.yaml", "short.yaml"]
    out = snakemake(workdir, target, "-n", *configs, "--quiet", "rules").stdout
    assert re.search(r"^tokenize_part\s+2$", out, re.M) and re.search(r"^tokenize\s+1$", out, re.M)
    shell = snakemake(workdir, target, "-n", "-p", *configs).stdout
    assert "--part 001 --parts 2" in shell
    assert "--from-parts results/data/fineweb100B/token_parts/part_000.bin" in shell


def with_node_cpus(config: dict, cpus: int) -> dict:
    """The config with every GPU run's node at `cpus` CPUs (a tokenize job takes the most)."""
    out = copy.deepcopy(config)
    for r in out["runs"].values():
        if r["launch"]["device"] == "cuda":
            r["launch"]["cpus_per_task"] = cpus
    return out


def test_tokenizing_is_no_faster_than_its_one_thread_that_reads_and_writes(config, dags):
    """The pool encodes on every core, but one thread reads the parquet and writes the shards:
    124M's 10B tokens take at least that thread's time, its measured CPU time a token
    (tokenize.serial_tokens_per_s) and its bytes at the disk's rate, however many cores the
    node has: minutes, not the encoding's 94 s on 64 cores."""
    cpu_s = 1e10 / figure("tokenize", "serial_tokens_per_s")
    disk_s = (
        1e10 * (figure("tokenize", "raw_bytes_per_token") + 2) / figure("io", "disk_bytes_per_s")
    )
    job = jobs_of(config, dags["124m"])["tokenize fineweb10B"]
    assert job.cpus == 64 and job.estimate_s > cpu_s + disk_s > 3 * 60
    assert (
        costs.tokenize_job(with_node_cpus(config, 1024), "fineweb10B").estimate_s > cpu_s + disk_s
    )
    # on few cores the encoding is the slower part, and the estimate grows with fewer
    four = costs.tokenize_job(with_node_cpus(config, 4), "fineweb10B")
    assert four.estimate_s > 2 * job.estimate_s and four.basis.split(": ")[1].startswith("BPE")


def test_the_tokenize_line_says_which_figures_are_measured_and_which_assumed(config, dags):
    basis = jobs_of(config, dags["124m"])["tokenize fineweb10B"].basis
    assert re.search(r"capped by one thread reading and writing [\d.e+]+/s \(its CPU [\d.e+]+/s"
                     r" measured; 2.9 bytes a token read assumed, 2 written, at 500 MB/s assumed\)",
                     basis), basis  # fmt: skip
    assert re.search(r"BPE [\d.e+]+/s on 64 cores \(a core's [\d.e+]+/s measured, efficiency"
                     r" 0.5 assumed\)", basis), basis  # fmt: skip


def test_max_files_drives_the_download_estimate_not_the_runs_tokens(config):
    """A dataset with max_files N downloads N of the hub's parquet files (lmpipe.data.download):
    its estimate is N files' bytes at the assumed size of one, twice as long for 2 as for 1,
    whatever the runs train on; without max_files, the dataset's tokens' raw bytes."""
    whole = costs.download_job(config, "fineweb10B")
    assert whole.disk_bytes == pytest.approx(1e10 * figure("tokenize", "raw_bytes_per_token"))

    def capped(files: int, approx_tokens: float = 1e10) -> costs.Job:
        cfg = copy.deepcopy(config)
        cfg["datasets"]["fineweb10B"] |= {"max_files": files, "approx_tokens": approx_tokens}
        return costs.download_job(cfg, "fineweb10B")

    one, two = capped(1), capped(2)
    assert one.disk_bytes == figure("io", "hub_file_bytes") < whole.disk_bytes / 10
    assert two.disk_bytes == 2 * one.disk_bytes and two.estimate_s == 2 * one.estimate_s
    assert capped(1, approx_tokens=1e11).estimate_s == one.estimate_s
    assert "max_files 1 x 2.1 GB assumed (a hub file), at 100 MB/s assumed" in one.basis
    assert "1e+10 tokens x 2.9 bytes assumed, at 100 MB/s assumed" in whole.basis


def test_a_dataset_capped_by_max_files_tokenizes_what_its_files_hold(config):
    """max_files 1 of sample-10BT: the tokenize job's tokens are one hub file's bytes at the raw
    bytes a token, not the dataset's 10B; a cap above the dataset leaves its tokens."""
    one_file = figure("io", "hub_file_bytes") / figure("tokenize", "raw_bytes_per_token")
    cfg = copy.deepcopy(config)
    cfg["datasets"]["fineweb10B"]["max_files"] = 1
    assert costs.dataset_tokens(cfg, "fineweb10B") == pytest.approx(one_file)
    capped, whole = costs.tokenize_job(cfg, "fineweb10B"), costs.tokenize_job(config, "fineweb10B")
    assert (
        capped.basis.startswith(f"{one_file:.3g} tokens") and capped.disk_bytes < whole.disk_bytes
    )
    cfg["datasets"]["fineweb10B"]["max_files"] = 1000
    assert costs.dataset_tokens(cfg, "fineweb10B") == 1e10


# ---- each evaluation's cost (lmpipe.registry.Evaluation.cost) -----------------------------------


def test_an_evaluation_must_carry_its_cost():
    """`cost` has no default: an entry without one does not build."""
    [cost] = [f for f in dataclasses.fields(Evaluation) if f.name == "cost"]
    assert cost.default is dataclasses.MISSING and cost.default_factory is dataclasses.MISSING
    with pytest.raises(TypeError, match="cost"):
        Evaluation("toy", "lmpipe.eval.toy:evaluate", "samples", SampleSettings)


def test_every_evaluation_costs_something_where_it_applies(config):
    """Each evaluation, on every run of the config it applies to (the suite switched on), runs
    some tokens forward: a new evaluation cannot cost the plan nothing."""
    cfg = copy.deepcopy(config)
    for r in cfg["runs"].values():
        r["eval"]["suite"] = {"tasks": ["copa", "mmlu"], "items": 5}
    schema.validate(cfg)
    costed = set()
    for run in cfg["runs"]:
        rc = lmconfig.run_config(cfg, run)
        for evaluation in lmconfig.evaluations_of(cfg, run):
            assert costs.eval_tokens(cfg, rc, evaluation) > 0, f"{run}: {evaluation}"
            costed.add(evaluation)
    assert costed == set(EVALUATIONS)


def test_the_costs_are_the_measured_figures(config):
    """The 124M run's evaluations as the plan costs them: the settings times each one's
    measured tokens (resources/throughputs.yaml, the suite's tasks' item counts)."""
    rc = lmconfig.run_config(config, "124m")
    tokens = {e: costs.eval_tokens(config, rc, e) for e in lmconfig.evaluations_of(config, "124m")}
    assert tokens["val_loss"] == 10_485_760
    assert tokens["hellaswag"] == pytest.approx(10_042 * 170.2)
    assert tokens["hellaswag_lm_eval"] == pytest.approx(10_042 * 330 * 3.61, rel=1e-3)
    assert tokens["samples"] == 4 * sum(10 + i for i in range(48))
    # 5 items x 2 choices, 5 x 4 (of all MMLU: not yet 5 of each subject), 100 tokens a row
    suite = {"tasks": ["copa", "mmlu"], "items": 5}
    assert EVALUATIONS["suite"].cost(SuiteSettings(**suite), None) == (10 + 20) * 100


# ---- the plan's jobs are Snakemake's (lmpipe.dag), each rule costed ----------------------------


def test_every_rule_of_the_workflow_is_costed():
    """A rule added to workflow/rules/ without a cost in the plan fails here (and `python -m
    lmpipe.plan` would stop naming it), never a job silently left out of the plan."""
    rules = {
        m.group(1)
        for smk in (REPO / "workflow" / "rules").glob("*.smk")
        for m in re.finditer(r"^(?:use )?rule (?:\w+ as )?(\w+)(?::| with:)", smk.read_text(), re.M)
    }
    assert rules == set(plan.RULE_COSTS)


def test_a_job_of_a_rule_without_a_cost_stops_the_plan_naming_it(config):
    jobs = [DagJob("report", {"report": "124m"}), DagJob("fetch_weights", {"run": "124m"})]
    with pytest.raises(plan.PlanError, match="fetch_weights: no cost"):
        plan.cost_jobs(config, jobs)


def test_the_plan_has_every_job_snakemake_runs(config, dags):
    """The 124M report's DAG holds the suite's download (a local rule), which the plan's own list
    of jobs once left out; the plan is that DAG, job for job: 14 jobs of the trained run, and 8
    of the reference run gpt2-openai (its download, its folder, its 6 evaluations), and 2 that
    count the suite's and HellaSwag's text in GPT-2's tokens (task_bytes)."""
    jobs = jobs_of(config, dags["124m"])
    assert {"download_suite", "download_model gpt2-openai", "reference gpt2-openai"} <= set(jobs)
    assert {"task_bytes suite/gpt2", "task_bytes hellaswag-full/gpt2"} <= set(jobs)
    assert len(jobs) == len(dags["124m"]) == 14 + 8 + 2


def plan_cli(*args: str):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "lmpipe.plan", "results/report_124m.html", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_an_unknown_gpu_is_one_short_error_naming_the_known_ones_and_how_to_give_a_peak():
    proc = plan_cli("--gpu", "rtx4090")
    assert proc.returncode != 0
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) <= 3, lines
    assert "'rtx4090'" in lines[-1] and "a100, " in lines[-1] and "--gpu rtx4090=" in lines[-1]
    given = plan_cli("--gpu", "rtx4090=165e12", "--price", "0.5")
    assert given.returncode == 0, given.stderr
    assert re.search(r"on rtx4090 at \$0.5/GPU-hour", given.stdout), given.stdout[-500:]


def test_the_cost_follows_the_price_of_the_gpu(config, capsys):
    """The report's price by GPU type (config.yaml: a100 $2, h100 $3): --gpu h100 costs the
    H100's hours at the H100's price; --price overrides it."""
    prices = config["reports"]["124m"]["gpu_hour_price"]
    assert (prices["a100"], prices["h100"]) == (2.0, 3.0)

    def cost_and_hours(*args: str) -> tuple[float, float, str]:
        assert plan.main(["results/report_124m.html", "--config", str(CONFIG_FILE), *args]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("report "))
        cost = float(re.search(r"about \$([\d,]+)", line).group(1).replace(",", ""))
        hours = float(re.search(r"([\d.]+) on (\S+) at", line).group(1))
        return cost, hours, line

    cost, hours, line = cost_and_hours()
    assert "on a100 at $2/GPU-hour" in line and cost == pytest.approx(2.0 * hours, abs=1)
    cost, hours, line = cost_and_hours("--gpu", "h100")
    assert "on h100 at $3/GPU-hour" in line and cost == pytest.approx(3.0 * hours, abs=1)
    cost, hours, line = cost_and_hours("--gpu", "h100", "--price", "10")
    assert cost == pytest.approx(10.0 * hours, abs=1)


def test_a_run_without_a_gpu_model_is_planned_as_any_gpu_said_so(config, dags):
    """SLURM gives any GPU where launch.gpu_model is unset: the plan says what it assumed."""
    assert config["runs"]["124m"]["launch"].get("gpu_model") is None
    job = jobs_of(config, dags["124m"])["train 124m"]
    assert "any GPU (launch.gpu_model unset) as a100" in job.basis


def test_a_cpu_run_with_the_gpu_sized_evaluation_defaults_gets_a_word_in_the_plan(config):
    """The evaluations' defaults are llm.c's (10M val tokens, all of HellaSwag): on a CPU run
    the plan names each one estimated over 30 minutes, and the section to shrink."""
    small = copy.deepcopy(config)
    small["runs"]["embedded-a"]["eval"] |= {"val_loss": {}, "hellaswag": {"file": "embedded"}}
    schema.validate(small)  # the sections' defaults
    names = ("val_loss", "hellaswag_lm_eval")
    slow = plan.slow_on_cpu([costs.eval_job(small, "embedded-a", e, None) for e in names])
    assert len(slow) == 2 and "eval.val_loss" in slow[0] and "eval.hellaswag" in slow[1], slow
    assert "on the CPU" in slow[0]
    shipped = [costs.eval_job(config, "embedded-a", e, None) for e in ("val_loss", "hellaswag")]
    assert plan.slow_on_cpu(shipped) == []


def test_a_train_job_over_its_gpus_memory_is_flagged_with_what_recompute_would_need(config, dags):
    """The 124M run at 64 x 1024 tokens a micro-step needs about 41 GB a GPU: it fits an 80 GB
    A100, not a 40 GB one, and the flag names recompute's figures. Full recompute keeps a block's
    input (2 C bytes a token a layer) instead of its 34 C, plus one block recomputed at a time:
    (12 x 34 - 12 x 2 - 34) x 768 x 65,536 bytes = 17.6 GB less, by hand."""
    assert not jobs_of(config, dags["124m"], "a100")["train 124m"].problems
    job = jobs_of(config, dags["124m"], "a100-sxm4-40gb")["train 124m"]
    (problem,) = job.problems
    assert re.fullmatch(
        r"needs about 41 GB a GPU, over the a100-sxm4-40gb's 40 GB: lower train.micro_batch, or"
        r" set train.activation_checkpointing \(selective \d+ GB, full \d+ GB\)",
        problem,
    )
    rc = lmconfig.run_config(config, "124m")
    saved = costs.gpu_memory_gb(rc) - costs.gpu_memory_gb(rc, "full")
    assert saved == pytest.approx((12 * 34 - 12 * 2 - 34) * 768 * 65536 / 1e9)
    full = copy.deepcopy(config)
    full["runs"]["124m"]["train"]["activation_checkpointing"] = "full"
    schema.validate(full)
    assert not jobs_of(full, dags["124m"], "a100-sxm4-40gb")["train 124m"].problems


def test_the_bigger_presets_are_llmcs_runs_and_the_plan_says_what_they_need(config, dags):
    """774M: 150B tokens (llm.c's 286,102 steps of 524,288), 1.5 epochs of sample-100BT, which on
    A100s at the assumed MFU needs more 48-hour jobs in a row than the retries allow; 1558M:
    33.5B tokens of FineWeb-Edu, over a 40 GB card's memory without recompute."""
    jobs = jobs_of(config, dags["774m"])
    assert "1.5e+11 tokens" in jobs["train 774m"].basis
    assert "1.5 epochs of fineweb100B" in jobs["train 774m"].basis
    (problem,) = jobs_of(config, dags["774m"], "a100")["train 774m"].problems
    assert re.match(r"needs \d jobs of 2880 min in a row; the slurm profile allows 4", problem)
    assert "3.36e+10 tokens" in jobs_of(config, dags["1558m"])["train 1558m"].basis
    (problem,) = jobs_of(config, dags["1558m"], "a100-sxm4-40gb")["train 1558m"].problems
    assert "set train.activation_checkpointing (selective" in problem
    rc = lmconfig.run_config(config, "124m-1gpu")
    assert rc.train.grad_accum_steps(rc.launch.world_size) == 8  # the 8 GPUs' batch on one


def test_the_vicuna_7b_report_plans_with_its_base_not_yet_downloaded(config, tmp_path):
    """Its base is a hub model the download stage fetches: planning the report reads no folder
    of it (the conversations' tokenizer is named by the hub id and pinned revision), and every
    job fits its limit."""
    dag = target_jobs("results/report_vicuna-7b.html", workdir=make_workdir(tmp_path))
    jobs = jobs_of(config, dag)
    assert [name for name, j in jobs.items() if j.problems] == []
    rules = {j.rule for j in jobs.values()}
    assert {"download_model", "prepare_conversations_for_model", "train"} <= rules
    run = config["runs"]["vicuna-7b"]
    params = lmconfig.conversations_params(config, run["dataset"], run["model"])
    model = config["models"][run["model"]]
    assert f"{model['path']}@{model['revision']}" in params
    # the train job builds its model from that folder, not from the hub id
    job = json.loads(lmconfig.train_params(config, "vicuna-7b"))
    assert job["model"]["path"] == lmconfig.layout(config).hub_model_dir("llama-2-7b")


def test_every_cli_of_the_ground_prints_its_help():
    """`--help` of the plan and the schema check: argparse formats help strings with %, which a
    help quoting sinfo's %-fields must double."""
    import subprocess
    import sys

    for module in ("lmpipe.plan", "lmpipe.schema"):
        done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                              text=True, cwd=REPO)  # fmt: skip
        assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


def test_train_tokenizer_is_costed_at_its_measured_rate(config):
    """The job's text (its budget in bytes, or in documents) at resources/throughputs.yaml's rate,
    measured on the embedded sample; not a fixed guess."""
    rates = yaml.safe_load((REPO / "resources" / "throughputs.yaml").read_text())["train_tokenizer"]
    rate = rates["text_bytes_per_s"]
    assert "measured" in rate and rate["date"]
    c = copy.deepcopy(config)
    c["tokenizers"]["embedded-4k"]["max_bytes"] = 3_000_000
    job = plan.RULE_COSTS["train_tokenizer"](c, {"tokenizer": "embedded-4k"}, None, None)
    assert job.estimate_s == pytest.approx(3e6 / rate["value"] + 10)
    assert job.basis.endswith(": measured") and job.cpus == 1
    c["tokenizers"]["embedded-4k"] |= {"max_bytes": None, "max_documents": 100}
    job = plan.RULE_COSTS["train_tokenizer"](c, {"tokenizer": "embedded-4k"}, None, None)
    per_document = rates["text_bytes_per_document"]["value"]
    assert job.estimate_s == pytest.approx(100 * per_document / rate["value"] + 10)
