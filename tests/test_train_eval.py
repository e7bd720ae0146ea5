"""HellaSwag during training (train.eval_every): the score of the model as it trains, shared out
over FSDP ranks, equals lmpipe.eval.hellaswag's of the same weights in one process; it never
changes the trajectory, and a run resumes across a change of it.

Real FSDP2 on gloo (2 CPU ranks), real HellaSwag items (resources/hellaswag_val_sample.jsonl),
real FineWeb shards (test_train's tiny GPT-2 and runs).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_train import MODEL, command, config, load_final, losses, manifest, metrics, run

from conftest import CONFIG_FILE, RESOURCES, kill_at_checkpoint, run_ranks_or_fail
from lmpipe.config import TrainJob
from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval.hellaswag import NUM_ENDINGS as ENDINGS
from lmpipe.eval.hellaswag import load_items as load_hellaswag
from lmpipe.paths import TOKENIZER_DIR
from lmpipe.train.hellaswag import hellaswag_correct, hellaswag_share
from lmpipe.train.loop import NOT_TRAJECTORY, Task, trajectory_hash

__all__ = ["manifest"]  # test_train's fixture, used here

HELLASWAG = RESOURCES / "hellaswag_val_sample.jsonl"


# ---- pure parts --------------------------------------------------------------------------------


def test_every_item_is_scored_once_and_every_rank_runs_as_many_rows():
    items = load_hellaswag(HELLASWAG, 9)
    assert len(items) == 9 and load_hellaswag(HELLASWAG, 10**6)[8] == items[8]
    shares = [hellaswag_share(items, rank, 4) for rank in range(4)]  # 3, 2, 2, 2 items
    assert {len(s.rows) for s in shares} == {3 * ENDINGS}  # padded: the same forward passes
    assert [s.labels.count(-1) for s in shares] == [0, 1, 1, 1]
    assert all(s.total == 9 for s in shares)
    counted = sorted(
        (label, str(row))
        for s in shares
        for label, row in zip(s.labels, s.rows[::ENDINGS], strict=True)
        if label >= 0
    )
    whole = hellaswag_share(items, 0, 1)  # one rank: every item, in order, no padding
    assert whole.labels == [item["label"] for item in items] and len(whole.rows) == 9 * ENDINGS
    assert counted == sorted(zip(whole.labels, map(str, whole.rows[::ENDINGS]), strict=True))
    # llm.c's rows: the context's tokens, then those of " " + ending
    ctx, ending = whole.rows[3]
    assert ctx[:4] == [32, 582, 318, 5586]  # "A man is sitting"
    assert ending == gpt2_encoding(TOKENIZER_DIR).encode_ordinary(" " + items[0]["endings"][3])


def test_a_malformed_file_names_its_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = HELLASWAG.read_text().splitlines()[0]
    bad.write_text(good + "\n\n" + json.dumps({"ctx": "x", "endings": ["a"], "label": 0}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:3: field 'activity_label' missing"):
        load_hellaswag(bad, 5)


def test_eval_settings_never_change_the_trajectory_hash():
    assert {"eval_every", "eval_items"} <= set(NOT_TRAJECTORY)
    hashes = set()
    for every, items in ((0, 10042), (4, 100), (250, 10042)):
        job = TrainJob.from_json(json.dumps(config(2, eval_every=every, eval_items=items)))
        task = Task(train=job.train, loader=None, val_batches=[], data_identity=["x"])
        hashes.add(trajectory_hash(job, task, 2))
    assert len(hashes) == 1


def test_the_cost_estimate_of_the_shipped_gpu_runs_is_under_3_percent():
    import yaml

    from lmpipe import plan, schema

    config_ = yaml.safe_load(CONFIG_FILE.read_text())
    schema.validate(config_)
    for run_name in ("124m", "350m"):
        cost = plan.in_training_eval(config_, run_name, None)
        assert cost is not None and 0.005 < cost.share < 0.03, (run_name, cost)
        job = plan.train_job(config_, run_name, None)
        assert "HellaSwag every" in job.basis
    assert plan.in_training_eval(config_, "embedded-a-chat", None) is None  # eval_every 0


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
        share = hellaswag_share(load_hellaswag(HELLASWAG, items_n), rank, world_size)
        x = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(rank))
        result = {}
        for reshard in (False, True):
            torch.manual_seed(0)
            fsdp = FSDPConfig(reshard_after_forward=reshard)
            model = parallelize(build_model(tiny()), torch.device("cpu"), "float32", False, fsdp)
            counts = []
            for _ in range(2):
                model(x[:, :-1], x[:, 1:])[1].backward()  # no optimizer step: the same weights
                counts.append(hellaswag_correct(model, share, 2, torch.device("cpu")))
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
    cmd = command(cfg, manifest, out) + ["--hellaswag", str(HELLASWAG)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"training failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow
def test_in_training_hellaswag_on_two_ranks(manifest, tmp_path):
    """Records at steps 0, 4 and 8 (eval_every 4, the last); the last one's counts equal those of
    lmpipe.eval.hellaswag on the final weights in one process; the losses equal a run killed at
    its step-4 checkpoint without evals and resumed with other evals (eval_every 0 -> 3)."""
    from lmpipe.eval.hellaswag import load_items, task_data
    from lmpipe.eval.suite.native import score_task
    from lmpipe.models.gpt2.model import GPT, GPTConfig

    items = 21  # 11 and 10 a rank
    evaluated = tmp_path / "evaluated"
    proc = run_with_hellaswag(config(2, eval_every=4, eval_items=items), manifest, evaluated)
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

    # no evals up to a SIGKILL at the step-4 checkpoint; resumed with eval_every 3
    resumed = tmp_path / "resumed"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    kill_at_checkpoint(command(config(2), manifest, resumed), env, resumed, step=4)
    restart = run_with_hellaswag(config(2, eval_every=3, eval_items=items), manifest, resumed)
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
    assert meta["train"]["eval_every"] == 3 and meta["eval_s"] > 0


@pytest.mark.slow
def test_eval_every_without_the_items_file_stops_before_training(manifest, tmp_path):
    proc = run(config(1, eval_every=4), manifest, tmp_path / "run", check=False)
    assert proc.returncode != 0
    assert "train.eval_every is 4: HellaSwag during training needs its items file" in proc.stderr
