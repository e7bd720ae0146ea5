"""bf16 mixed precision before a GPU: `train.dtype: bfloat16` on the CPU takes the GPU's path
(FSDP2's MixedPrecisionPolicy: bf16 parameters gathered for the forward and backward, gradients
reduce-scattered in fp32 over gloo, fp32 weights stepped) through the compiled regions
(`compile_scope: regions`, CPU Inductor), the chunked loss (`loss_chunk_tokens`) and the modern
model with its document mask, 2 ranks through torchrun (`python -m lmpipe.train`, as the train
rule runs it), 2 micro-steps a step (one gradient reduction a step). Its losses are finite and
near the fp32 run's. With `embedding_dtype: bfloat16` too (the speedrun's setting, the record's
`bf16_embeds`) the embedding tables and their Adam moments are stored in bf16, and that run,
killed at its checkpoint and restarted, ends bit for bit where the uninterrupted one does.
tests/test_grad_sync.py checks the dtypes the policy computes and reduces in; this file, that a
whole run trains in them."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from test_modern import manifest  # noqa: F401 (a fixture: real FineWeb text as shards)

from conftest import kill_at_checkpoint
from lmpipe import config as lmconfig
from lmpipe.models.modern.model import ModernGPT, modern_config

# 5 trainings of a compiled model on 2 ranks (3 precisions, a kill and its restart): Inductor on
# 2 cores, then its cache
pytestmark = pytest.mark.slow

SHAPE = {
    "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64, "document_mask": True,
    "value_embeddings": 1,  # a second table beside the token embedding, as the record's three
}  # fmt: skip
STEPS = 6
TRAIN = {
    "seq_len": 64,
    "micro_batch": 2,
    "batch_tokens": 512,  # 64 * 2 * 2 ranks * 2 micro-steps
    "max_steps": STEPS,
    "optimizer": {"name": "adamw", "lr": 1e-2},
    "schedule": {"warmup_steps": 1, "lr_floor": 0.1},
    "val_every": 3,
    "val_tokens": 1024,
    "checkpoint_every": 3,
    "compile": True,  # compile_scope regions: the stem, each block and the tail
    "loss_chunk_tokens": 48,  # 256 positions a micro-step: chunks of 48 and a last one of 16
}
# Tolerance of the bf16 losses against the fp32 run's, absolute, on losses near ln(50257) =
# 10.8: fp32 runs of other orders of sums agree to 1e-4 (tests/test_train.py); bf16's rounding
# (2^-9 relative on each gathered weight and activation) moved these losses by up to 5.0e-4
# over the 6 steps, 1.9e-4 with the tables in bf16 too (torch 2.13, 2 CPU ranks). 5e-3 leaves
# 10x for another BLAS or Inductor's fusions; a lost cast to bf16 (fp32 throughout) is caught by
# the losses being equal.
BF16_LOSS_TOLERANCE = 5e-3


# the runs: train.dtype and train.embedding_dtype
PRECISIONS = {
    "fp32": {"dtype": "float32"},
    "bf16": {"dtype": "bfloat16"},
    "bf16-tables": {"dtype": "bfloat16", "embedding_dtype": "bfloat16"},
}
TABLES = ("transformer.wte.weight", "value_embeds.0.weight")


def job(precision: str) -> dict:
    """The train rule's params of a tiny modern run (defaults filled as lmpipe.config does)."""
    train = lmconfig.train_config(TRAIN | PRECISIONS[precision], "train")
    return {
        "run": "bf16",
        "dataset": "embedded",
        "model": dataclasses.asdict(modern_config(**SHAPE)),
        "train": json.loads(json.dumps(dataclasses.asdict(train))),
        "launch": {"device": "cpu", "nodes": 1, "procs_per_node": 2, "peak_flops": 1e12},
    }


def command(precision: str, data: Path, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "lmpipe.train", "--config-json", json.dumps(job(precision))]
    return [*cmd, "--data", str(data), "--out", str(out)]


ENV = dict(os.environ, OMP_NUM_THREADS="1")


def train(precision: str, data: Path, out: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        command(precision, data, out), env=ENV, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"training failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def losses(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [m["loss"] for m in rows if "loss" in m]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    """The final checkpoint as convert reads it (one process, into the fp32 model)."""
    state = ModernGPT(modern_config(**SHAPE)).state_dict()
    dcp.load({"model": state}, checkpoint_id=out / "final")
    return state


def stored_dtypes(checkpoint: Path) -> dict[str, torch.dtype]:
    """Each tensor's dtype as the checkpoint stores it (DCP's metadata), by its key."""
    metadata = dcp.FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    return {k: m.properties.dtype for k, m in metadata.items() if hasattr(m, "properties")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, manifest) -> dict[str, Path]:  # noqa: F811
    d = tmp_path_factory.mktemp("bf16_runs")
    for precision in PRECISIONS:
        train(precision, manifest, d / precision)
    return {precision: d / precision for precision in PRECISIONS}


def test_bf16_trains_finite_and_near_fp32(runs):
    bf16, fp32 = losses(runs["bf16"]), losses(runs["fp32"])
    assert len(bf16) == len(fp32) == STEPS
    assert all(math.isfinite(x) for x in bf16)
    assert bf16 != fp32  # the casts ran: bf16 rounding changes the losses
    worst = max(abs(a - b) for a, b in zip(bf16, fp32, strict=True))
    assert worst < BF16_LOSS_TOLERANCE, (bf16, fp32)
    assert bf16[-1] < bf16[0] - 0.1  # it trains (10.82 -> 10.65, from the zero head's ln V)
    prov = json.loads((runs["bf16"] / "provenance.json").read_text())
    assert prov["compiled"] == ["blocks", "embed", "head_loss"] and prov["loss_chunk_tokens"] == 48
    assert prov["world_size"] == 2
    # the weights saved are the fp32 ones the optimizer stepped
    assert {w.dtype for w in final_weights(runs["bf16"]).values()} == {torch.float32}


def test_bf16_tables_store_the_embeddings_and_their_moments_in_bf16(runs):
    """embedding_dtype bfloat16: each update is rounded to the bf16 tables, so the run parts
    from the bf16 run's (fp32 masters gathered in bf16) after its first step, and stays near
    the fp32 run; the checkpoint holds the tables and their Adam moments in bf16, every other
    weight and moment in fp32; convert reads them into the fp32 model."""
    tables, bf16 = losses(runs["bf16-tables"]), losses(runs["bf16"])
    assert tables[1:] != bf16[1:]  # the tables' updates rounded to bf16
    assert all(math.isfinite(x) for x in tables)
    worst = max(abs(a - b) for a, b in zip(tables, losses(runs["fp32"]), strict=True))
    assert worst < BF16_LOSS_TOLERANCE, (tables, bf16)
    stored = stored_dtypes(runs["bf16-tables"] / "checkpoints" / f"step_{STEPS:06d}")
    checked = {}
    for key, dtype in stored.items():
        if key.startswith("model."):
            name = key.removeprefix("model.")
        elif key.endswith((".exp_avg", ".exp_avg_sq")):  # AdamW's moments of parameter `name`
            name = key.removeprefix("optim.state.").rsplit(".", 1)[0]
        else:
            continue  # the step counts, the param groups
        checked[key] = dtype
        assert dtype == (torch.bfloat16 if name in TABLES else torch.float32), key
    bf16_keys = sorted(k for k, d in checked.items() if d == torch.bfloat16)
    assert len(bf16_keys) == 3 * len(TABLES), bf16_keys  # each table and its two moments
    # the final weights, read into the fp32 model as convert reads them: the tables bf16 values
    weights = final_weights(runs["bf16-tables"])
    for name in TABLES:
        assert torch.equal(weights[name], weights[name].bfloat16().float()), name
    assert not torch.equal(weights["lm_head.weight"], weights["lm_head.weight"].bfloat16().float())


def test_bf16_tables_killed_at_a_checkpoint_resume_bit_for_bit(runs, manifest, tmp_path):  # noqa: F811
    """The speedrun's precision (bf16 compute, bf16 tables and moments) killed at step 3 and
    restarted: the same losses and final weights as the uninterrupted run, exactly."""
    out = tmp_path / "killed"
    kill_at_checkpoint(command("bf16-tables", manifest, out), ENV, out, step=3, timeout=600)
    restart = train("bf16-tables", manifest, out)
    assert "resumed from" in restart.stderr and "step_000003" in restart.stderr
    assert losses(out) == losses(runs["bf16-tables"])  # exactly, the steps before the kill too
    a, b = final_weights(out), final_weights(runs["bf16-tables"])
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
