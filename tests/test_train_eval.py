"""Evaluations during training (a section's `during_training`, lmpipe.train.evaluators), with
HellaSwag as the example: the score of the model as it trains, shared out over FSDP ranks, equals
lmpipe.eval.hellaswag's of the same weights in one process; it never changes the trajectory, and
a run resumes across a change of it. The loop calls the evaluators it is handed (a toy one here)
and names none; the old train.eval_* keys are refused naming the new ones.

Real FSDP2 on gloo (2 CPU ranks), real HellaSwag items (resources/hellaswag_val_sample.jsonl),
real FineWeb shards (test_train's tiny GPT-2 and runs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from test_train import MODEL, command, config, load_final, losses, manifest, metrics, run

from conftest import CONFIG_FILE, RESOURCES, kill_at_checkpoint, run_ranks_or_fail
from lmpipe.config import ConfigError, TrainJob
from lmpipe.data.loader import ValSet
from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval.hellaswag import NUM_ENDINGS as ENDINGS
from lmpipe.eval.hellaswag import load_items as load_hellaswag
from lmpipe.paths import TOKENIZER_DIR
from lmpipe.train.evaluators import count_right, hellaswag_task, share_of
from lmpipe.train.loop import Task, trajectory_hash

__all__ = ["manifest"]  # test_train's fixture, used here

HELLASWAG = RESOURCES / "hellaswag_val_sample.jsonl"


def with_evals(cfg: dict, **evals: dict) -> dict:
    """A train job (test_train.config) with evaluations during training, as the train params
    carry them (lmpipe.config.in_training): name -> its settings."""
    return cfg | {"during_training": evals}


def hellaswag_settings(every: int, items: int) -> dict:
    return {"every": every, "items": items, "file": "embedded"}


# ---- pure parts --------------------------------------------------------------------------------


def test_every_item_is_scored_once_and_every_rank_runs_as_many_rows():
    items = load_hellaswag(HELLASWAG, 9)
    assert len(items) == 9 and load_hellaswag(HELLASWAG, 10**6)[8] == items[8]
    task = hellaswag_task(HELLASWAG, 9, gpt2_encoding(TOKENIZER_DIR))
    shares = [share_of(task, rank, 4) for rank in range(4)]  # 3, 2, 2, 2 items
    assert {len(s.rows) for s in shares} == {3 * ENDINGS}  # padded: the same forward passes
    assert [s.counted.count(False) for s in shares] == [0, 1, 1, 1]
    assert all(s.total == 9 for s in shares)
    counted = sorted(
        (item.gold, str(item.rows[0]))
        for s in shares
        for item, c in zip(s.items, s.counted, strict=True)
        if c
    )
    whole = share_of(task, 0, 1)  # one rank: every item, in order, no padding
    assert [it.gold for it in whole.items] == [item["label"] for item in items]
    assert len(whole.rows) == 9 * ENDINGS and all(whole.counted)
    assert counted == sorted((it.gold, str(it.rows[0])) for it in whole.items)
    # llm.c's rows: the context's tokens, then those of " " + ending; acc_norm by its tokens
    ctx, ending = whole.rows[3]
    assert ctx[:4] == [32, 582, 318, 5586]  # "A man is sitting"
    assert ending == gpt2_encoding(TOKENIZER_DIR).encode_ordinary(" " + items[0]["endings"][3])
    assert whole.items[0].choice_lengths[3] == len(ending)


def test_a_malformed_file_names_its_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = HELLASWAG.read_text().splitlines()[0]
    bad.write_text(good + "\n\n" + json.dumps({"ctx": "x", "endings": ["a"], "label": 0}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:3: field 'activity_label' missing"):
        load_hellaswag(bad, 5)


def test_eval_settings_never_change_the_trajectory_hash():
    hashes = set()
    for every, items in ((0, 10042), (4, 100), (250, 10042)):
        evals = {"hellaswag": hellaswag_settings(every, items)} if every else {}
        job = TrainJob.from_json(json.dumps(with_evals(config(2), **evals)))
        assert job.during_training == evals
        task = Task(train=job.train, loader=None, val=ValSet([], [], 0), data_identity=["x"])
        hashes.add(trajectory_hash(job, task, 2))
    assert len(hashes) == 1


@pytest.mark.parametrize(
    ("key", "new"),
    [
        ("eval_every", "eval.hellaswag.during_training.every"),
        ("eval_items", "eval.hellaswag.during_training.items"),
        ("eval_tasks", "eval.suite.during_training.tasks"),
        ("eval_task_items", "eval.suite.during_training.items"),
    ],
)
def test_the_old_train_keys_are_refused_naming_the_new_one(key, new):
    from lmpipe import schema

    raw = yaml.safe_load(CONFIG_FILE.read_text())
    raw["runs"]["embedded-a"]["train"][key] = 8
    with pytest.raises(ConfigError) as e:
        schema.validate(raw)
    assert str(e.value) == f"runs.embedded-a.train.{key}: moved to runs.embedded-a.{new}"


def test_the_loop_names_no_evaluation():
    from lmpipe.train import loop

    source = Path(loop.__file__).read_text()
    assert not re.search(r"hellaswag|suite", source, re.IGNORECASE)


def test_the_cost_estimate_of_the_shipped_gpu_runs_is_under_3_percent():
    import yaml

    from lmpipe import costs, schema

    config_ = yaml.safe_load(CONFIG_FILE.read_text())
    schema.validate(config_)
    for run_name in ("124m", "350m"):
        cost = costs.in_training_eval(config_, run_name, None)
        assert cost is not None and 0.005 < cost.share < 0.03, (run_name, cost)
        job = costs.train_job(config_, run_name, None)
        assert "during training hellaswag every" in job.basis
    assert costs.in_training_eval(config_, "embedded-a-chat", None) is None  # none during it


def test_the_figure_shows_runs_with_in_training_evals_only():
    from lmpipe.report.figures import hellaswag_figure, hellaswag_references
    from lmpipe.report.runs import Run

    refs = hellaswag_references()  # GPT-2 (124M) and GPT-3 Small (125M), as published
    assert [value for _, value in refs] == [0.2955, 0.337]
    assert refs[0][0].startswith("OpenAI GPT-2 124M") and refs[1][0].startswith("GPT-3 Small")
    curve = [{"step": s, "tokens": 4096 * s, "hellaswag": 0.25 + s / 1000} for s in (0, 8, 16)]
    assert hellaswag_figure([Run("a", {}), Run("b", {})]) is None  # no empty figure
    png = hellaswag_figure([Run("a", {}, hellaswag_curve=curve), Run("b", {})])
    assert png is not None and png.startswith("data:image/png;base64,")


# ---- 2 FSDP ranks against one process, the scorer alone ----------------------------------------


def score_on_ranks(rank: int, world_size: int, port: int, items_n: int, out: str) -> None:
    """A rank: the tiny GPT-2 from seed 0, sharded by the trainer's parallelize (blocks kept
    gathered after their forward, as by default, or not), then twice a training micro-step
    (forward and backward, which leave every parameter sharded: the state the loop evaluates in)
    and HellaSwag as the loop does it."""
    from lmpipe.config import FSDPConfig
    from lmpipe.models import build_model
    from lmpipe.train.parallel import parallelize

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        share = share_of(
            hellaswag_task(HELLASWAG, items_n, gpt2_encoding(TOKENIZER_DIR)), rank, world_size
        )
        x = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(rank))
        result = {}
        for reshard in (False, True):
            torch.manual_seed(0)
            fsdp = FSDPConfig(reshard_after_forward=reshard)
            model = parallelize(build_model(tiny()), torch.device("cpu"), "float32", False, fsdp)
            counts = []
            for _ in range(2):
                model(x[:, :-1], x[:, 1:])[1].backward()  # no optimizer step: the same weights
                right = count_right(model, share, 2 * ENDINGS, torch.device("cpu"))
                counts.append([right["acc_norm"], right["acc"]])
            result[str(reshard)] = {"counts": counts, "training": model.training}
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def tiny():
    from lmpipe.config import ModelConfig

    return ModelConfig(**MODEL)


@pytest.mark.slow
def test_two_fsdp_ranks_count_what_one_process_scores(tmp_path):
    """9 items on 2 ranks, 2 a forward: 5 and 4 items, so 3 forwards each only with padding (with
    blocks resharded after their forward, a rank that stopped early would leave the other waiting
    in an all-gather: the deadline)."""
    from lmpipe.eval.hellaswag import load_items, task_data
    from lmpipe.eval.suite.native import score_task
    from lmpipe.models import build_model

    n, port = 9, 29000 + os.getpid() % 1000
    run_ranks_or_fail(score_on_ranks, (2, port, n, str(tmp_path)), nprocs=2)
    torch.manual_seed(0)
    model = build_model(tiny()).eval()
    enc = gpt2_encoding(TOKENIZER_DIR)
    task = task_data(load_items(HELLASWAG, n), enc, "llmc")
    one = score_task(model, task, enc, 4 * ENDINGS, show_progress=False)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    expected = [sum(one.acc_norm), sum(one.acc)]
    for r in ranks:
        for reshard in ("False", "True"):
            # summed over the ranks, each item once; the same after another training step
            assert r[reshard]["counts"] == [expected, expected], reshard
            assert r[reshard]["training"] is True  # back in train mode


# ---- the trainer -------------------------------------------------------------------------------


def hellaswag_rows(out: Path) -> list[dict]:
    return [m for m in metrics(out) if "hellaswag" in m]


def run_with_hellaswag(cfg: dict, manifest: Path, out: Path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = command(cfg, manifest, out) + ["--eval-input", f"hellaswag={HELLASWAG}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"training failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow
def test_in_training_hellaswag_on_two_ranks(manifest, tmp_path):
    """Records at steps 0, 4 and 8 (every 4, the last); the last one's counts equal those of
    lmpipe.eval.hellaswag on the final weights in one process; the losses equal a run killed at
    its step-4 checkpoint without evals and resumed with other evals (every 0 -> 3)."""
    from lmpipe.eval.hellaswag import load_items, task_data
    from lmpipe.eval.suite.native import score_task
    from lmpipe.models.gpt2.model import GPT, GPTConfig

    items = 21  # 11 and 10 a rank
    evaluated = tmp_path / "evaluated"
    cfg = with_evals(config(2), hellaswag=hellaswag_settings(4, items))
    proc = run_with_hellaswag(cfg, manifest, evaluated)
    rows = hellaswag_rows(evaluated)
    assert [r["step"] for r in rows] == [0, 4, 8]
    assert [r["tokens"] for r in rows] == [0, 4 * 256, 8 * 256]
    assert all(r["hellaswag_items"] == items and r["eval_s"] > 0 for r in rows)
    assert "hellaswag acc_norm" in proc.stdout and "of the wall time so far" in proc.stdout
    assert list((evaluated / "tb").glob("events.out.tfevents.*"))

    model = GPT(GPTConfig(**MODEL))
    model.load_state_dict(load_final(evaluated), strict=False)  # lm_head: tied to wte
    enc = gpt2_encoding(TOKENIZER_DIR)
    task = task_data(load_items(HELLASWAG, items), enc, "llmc")
    one = score_task(model.eval(), task, enc, 4 * ENDINGS, show_progress=False)
    assert rows[-1]["hellaswag"] == pytest.approx(sum(one.acc_norm) / items, abs=1e-12)
    assert rows[-1]["hellaswag_acc"] == pytest.approx(sum(one.acc) / items, abs=1e-12)

    # no evals up to a SIGKILL at the step-4 checkpoint; resumed with every 3
    resumed = tmp_path / "resumed"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    kill_at_checkpoint(command(config(2), manifest, resumed), env, resumed, step=4)
    cfg = with_evals(config(2), hellaswag=hellaswag_settings(3, items))
    restart = run_with_hellaswag(cfg, manifest, resumed)
    assert "resumed from" in restart.stderr and "step_000004" in restart.stderr
    assert [r["step"] for r in hellaswag_rows(resumed)] == [6, 8]
    assert losses(resumed) == losses(evaluated)  # exactly: the evals changed nothing
    assert len(losses(resumed)) == 8
    final = hellaswag_rows(resumed)[-1]
    assert (final["hellaswag"], final["hellaswag_acc"]) == (
        rows[-1]["hellaswag"],
        rows[-1]["hellaswag_acc"],
    )
    meta = json.loads((resumed / "final" / "meta.json").read_text())
    assert meta["during_training"]["hellaswag"]["every"] == 3
    assert 0 < meta["evals_s"]["hellaswag"] <= meta["eval_s"]


@pytest.mark.slow
def test_evaluations_never_make_the_compiled_training_graph_dynamic(manifest, tmp_path):
    """Compiled (the CPU's inductor), HellaSwag at step 0 before the first training step and
    every 2 after: the evaluations run eager, so the blocks compile for the training shape only
    and no size becomes a symbol (Dynamo's `dynamic` log names each symbol it creates; a
    HellaSwag batch reaching the compiled blocks first made the training graph dynamic)."""
    cfg = with_evals(config(1, compile=True, max_steps=4), hellaswag=hellaswag_settings(2, 6))
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_LOGS="dynamic,recompiles")
    cmd = command(cfg, manifest, tmp_path) + ["--eval-input", f"hellaswag={HELLASWAG}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [r["step"] for r in hellaswag_rows(tmp_path)] == [0, 2, 4]
    assert "create_symbol" not in proc.stderr, proc.stderr[-4000:]


@pytest.mark.slow
def test_an_evaluation_without_its_input_stops_before_training(manifest, tmp_path):
    cfg = with_evals(config(1), hellaswag=hellaswag_settings(4, 9))
    proc = run(cfg, manifest, tmp_path / "run", check=False)
    assert proc.returncode != 0
    assert (
        "runs.test.eval.hellaswag.during_training.every is 4: hellaswag during training needs its"
        " hellaswag input (--eval-input hellaswag=PATH)"
    ) in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---- the loop and an evaluator it is handed ----------------------------------------------------


class ToyEvaluator:
    """An evaluation of another kind: counts its calls, scores the step."""

    name = "toy"

    def __init__(self, every: int) -> None:
        self.every, self.calls = every, []

    def due(self, step: int, max_steps: int) -> bool:
        return step % self.every == 0 or step == max_steps

    def __call__(self, model: torch.nn.Module, step: int):
        from lmpipe.train.evaluators import Scores

        self.calls.append(step)
        total = torch.tensor(float(step))
        dist.all_reduce(total)  # a collective, as a real evaluator's
        return Scores({"toy": total.item(), "toy_calls": len(self.calls)}, [f"toy {step}"])


def train_with_toy(rank: int, world_size: int, port: int, manifest: str, out: str) -> None:
    """A rank of the pretraining worker's task through the loop, with the toy evaluator."""
    from lmpipe.train.loop import StopFlag, run
    from lmpipe.train.parallel import init_distributed
    from lmpipe.train.pretrain import pretraining

    os.environ |= {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
    }  # fmt: skip
    torch.set_num_threads(1)
    job = TrainJob.from_json(json.dumps(config(world_size, max_steps=7, checkpoint_every=0)))
    d = init_distributed("cpu")
    try:
        toy = ToyEvaluator(every=3)
        task = pretraining(job, Path(manifest), d, None)
        assert run(job, task, Path(out), d, StopFlag(), evaluators=[toy]) == 0
        Path(out, f"calls{rank}.json").write_text(json.dumps(toy.calls))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_loop_calls_the_evaluators_it_is_given_at_their_steps(manifest, tmp_path):
    """Steps 0, 3, 6 and the last (7) on both ranks: a metrics line each, the loop's own keys
    (step, tokens, eval_s, wall_s) around the evaluator's; its seconds in meta.json by name."""
    port = 29000 + (os.getpid() + 250) % 1000
    run_ranks_or_fail(train_with_toy, (2, port, str(manifest), str(tmp_path)), nprocs=2)
    assert [json.loads((tmp_path / f"calls{r}.json").read_text()) for r in range(2)] == [
        [0, 3, 6, 7],
        [0, 3, 6, 7],
    ]
    lines = [m for m in metrics(tmp_path) if "toy" in m]
    assert [(m["step"], m["toy"], m["toy_calls"]) for m in lines] == [
        (0, 0, 1), (3, 6, 2), (6, 12, 3), (7, 14, 4),
    ]  # fmt: skip
    assert all(list(m) == ["step", "tokens", "toy", "toy_calls", "eval_s", "wall_s"] for m in lines)
    meta = json.loads((tmp_path / "final" / "meta.json").read_text())
    assert meta["evals_s"]["toy"] == pytest.approx(sum(m["eval_s"] for m in lines))
    assert meta["eval_s"] == pytest.approx(meta["evals_s"]["toy"])
