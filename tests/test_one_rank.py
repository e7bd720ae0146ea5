"""One rank without FSDP2 (`train.fsdp.shard: never`, lmpipe.train.parallel.unsharded): the plain
model trains as the FSDP2-wrapped one does on one rank (the real trainer, `python -m
lmpipe.train` as one process, compiled regions); in bf16 (autocast) near its fp32 run; a DCP
checkpoint written by either loads into the other. And validation before training leaves the
training graphs static (the compiled blocks and stem never marked dynamic)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_modern import manifest  # noqa: F401 (a fixture: real FineWeb text as shards)

from lmpipe import config as lmconfig
from lmpipe.models.gpt2.model import GPTConfig

SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64}
VOCAB = {"vocab_size": 320, "padded_vocab_size": 384}
STEPS = 5
TRAIN = {
    "seq_len": 64, "micro_batch": 2, "batch_tokens": 256,  # 2 micro-steps a step
    "max_steps": STEPS, "optimizer": {"name": "adamw", "lr": 1e-2},
    "schedule": {"warmup_steps": 1, "lr_floor": 0.1}, "grad_clip": 0.5,
    "val_every": 0, "val_tokens": 512, "checkpoint_every": 0,
}  # fmt: skip
# fp32: the plain model computes what FSDP2 on one rank does (its all-gather and reduce-scatter
# copy; a mean over one rank divides by 1); they agreed to 0 on torch 2.13's CPU Inductor
# (another fusion or summation order moves a loss by ~1e-6). 1e-5 relative leaves 10x; a lost
# gradient clip (grad_clip 0.5 clips every step here) moves them by 1e-2.
FP32_REL = 1e-5
# bf16 by autocast against the fp32 run: as tests/test_bf16.py's bound (bf16 rounding)
BF16_ABS = 5e-3


def run(out: Path, manifest: Path, shard: str, dtype: str = "float32", compile: bool = True):  # noqa: F811
    """The trainer's worker, one process (a one-rank gloo group), on a tiny GPT-2."""
    settings = TRAIN | {"dtype": dtype, "compile": compile, "fsdp": {"shard": shard}}
    train = lmconfig.train_config(settings, "train")
    job = {
        "run": "one", "dataset": "embedded",
        "model": dataclasses.asdict(GPTConfig(**SHAPE, vocab_size=50257, padded_vocab_size=50304)),
        "train": json.loads(json.dumps(dataclasses.asdict(train))),
        "launch": {"device": "cpu", "nodes": 1, "procs_per_node": 1, "peak_flops": 1e12},
    }  # fmt: skip
    cmd = [sys.executable, "-m", "lmpipe.train", "--config-json", json.dumps(job)]
    cmd += ["--data", str(manifest), "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"training failed:\n{proc.stdout}\n{proc.stderr}"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    prov = json.loads((out / "provenance.json").read_text())
    return [r["loss"] for r in rows if "loss" in r], prov


@pytest.mark.slow
def test_the_plain_model_trains_as_fsdp_on_one_rank(manifest, tmp_path):  # noqa: F811
    fsdp, fsdp_prov = run(tmp_path / "fsdp", manifest, "always")
    plain, plain_prov = run(tmp_path / "plain", manifest, "never")
    assert len(plain) == len(fsdp) == STEPS
    assert plain == pytest.approx(fsdp, rel=FP32_REL)
    assert plain[-1] < plain[0] - 0.1  # it trains
    assert plain_prov["compiled"] == fsdp_prov["compiled"] == ["blocks", "embed", "head_loss"]
    bf16, _ = run(tmp_path / "bf16", manifest, "never", "bfloat16")
    assert all(math.isfinite(x) for x in bf16) and bf16 != plain  # autocast ran
    assert max(abs(a - b) for a, b in zip(bf16, plain, strict=True)) < BF16_ABS


def test_shard_never_on_several_ranks_is_refused_in_one_line():
    fsdp = lmconfig.FSDPConfig(shard="never")
    with pytest.raises(ValueError, match=r"fsdp.shard 'never' needs one rank; this run has 2"):
        fsdp.sharded(2)
    assert not fsdp.sharded(1)
    auto = lmconfig.FSDPConfig(shard="auto")
    assert (auto.sharded(1), auto.sharded(2)) == (False, True)
    assert lmconfig.FSDPConfig().sharded(1)  # always: as before


def tiny(shard: str, compile: bool = False, micro_batch: int = 2, scope: str = "regions"):
    from lmpipe.train.loop import training_model

    tc = lmconfig.train_config(
        TRAIN | {"fsdp": {"shard": shard}, "compile": compile, "micro_batch": micro_batch,
                 "batch_tokens": 64 * micro_batch}
        | ({"compile_scope": scope} if compile else {}),
        "train",
    )  # fmt: skip
    model, _ = training_model(
        lmconfig.model_config(SHAPE | VOCAB, "model"), tc, torch.device("cpu")
    )
    return model, tc


def trained_state(model, optimizer) -> dict[str, torch.Tensor]:
    """Model weights and AdamW moments by name, whole tensors."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    whole = {f"model.{k}": v for k, v in model_sd.items()}
    for name, state in optim_sd["state"].items():
        whole |= {f"optim.{name}.{k}": v for k, v in state.items() if k != "step"}
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in whole.items()}


@pytest.mark.usefixtures("one_rank_group")  # tests/conftest.py: destroyed after the module
@pytest.mark.parametrize("written, read", [("always", "never"), ("never", "always")])
def test_a_checkpoint_loads_across_fsdp_and_the_plain_model(written, read, tmp_path):
    from lmpipe.train.checkpoint import Checkpointer
    from lmpipe.train.optim import build_optimizer

    model, tc = tiny(written)
    optimizer = build_optimizer(model, tc.optimizer)
    idx = torch.randint(0, VOCAB["vocab_size"], (2, 65), generator=torch.Generator().manual_seed(0))
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    optimizer.step()
    ckpt = Checkpointer(tmp_path, "digest", 1, 2)
    path = ckpt.save(1, model, optimizer, {"tokens": 128})
    other, _ = tiny(read)
    other_opt = build_optimizer(other, tc.optimizer)
    assert ckpt.load(path, other, other_opt)["step"] == 1
    want, got = trained_state(model, optimizer), trained_state(other, other_opt)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize(
    "shard, scope", [("always", "regions"), ("never", "regions"), ("always", "model")]
)
def test_validation_first_leaves_the_training_graphs_static(shard, scope):
    """Validation's forward (1 row, no grad) before training's (2 rows, grad): Dynamo must not
    mark the compiled blocks', stem's or whole model's input dynamic (its log names each input
    it marks)."""
    torch._dynamo.reset()
    marked: list[str] = []

    class Marks(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "as dynamic" in record.getMessage():
                marked.append(record.getMessage())

    torch._logging.set_logs(dynamic=logging.INFO)
    handler = Marks()
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    logger.addHandler(handler)
    try:
        model, _ = tiny(shard, compile=True, scope=scope)
        idx = torch.randint(0, VOCAB["vocab_size"], (2, 65))
        with torch.no_grad():
            model(idx[:1, :-1])  # validation: its own rows
        model(idx[:, :-1], idx[:, 1:])[1].backward()
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()
    compiled = {"regions": ("blocks", "embed", "head_loss"), "model": ("model",)}
    assert model.compiled == compiled[scope]
    assert marked == []


# train.embedding_dtype bfloat16, with the bf16 compute it needs
BF16_TABLES = {"dtype": "bfloat16", "embedding_dtype": "bfloat16"}


def dtypes_after_a_step(config, tc, vocab_size: int) -> dict[str, torch.dtype]:
    """The trainer's model of `config` after one AdamW step: each weight's and moment's dtype."""
    from lmpipe.train.loop import training_model
    from lmpipe.train.optim import build_optimizer

    model, _ = training_model(config, tc, torch.device("cpu"))
    optimizer = build_optimizer(model, tc.optimizer)
    idx = torch.randint(
        0, vocab_size, (2, tc.seq_len + 1), generator=torch.Generator().manual_seed(0)
    )
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    optimizer.step()
    return {name: t.dtype for name, t in trained_state(model, optimizer).items()}


def in_bf16(dtypes: dict[str, torch.dtype]) -> set[str]:
    return {name for name, dtype in dtypes.items() if dtype == torch.bfloat16}


def tables_and_moments(*tables: str) -> set[str]:
    """trained_state's names of each table and of its two AdamW moments."""
    return {f"model.{t}" for t in tables} | {
        f"optim.{t}.{moment}" for t in tables for moment in ("exp_avg", "exp_avg_sq")
    }


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("shard", ["always", "never"])
def test_bf16_tables_hold_the_tables_and_their_moments_in_bf16(shard):
    """train.embedding_dtype bfloat16, with FSDP2 (the tables a unit of their own) and on the
    plain model (autocast): after a step, the token and value embeddings and their AdamW moments
    are bf16, every other weight and moment fp32. (tests/test_bf16.py trains it on 2 ranks.)"""
    tc = lmconfig.train_config(TRAIN | {"fsdp": {"shard": shard}} | BF16_TABLES, "train")
    shape = SHAPE | VOCAB | {"arch": "modern", "n_layer": 2, "value_embeddings": 1}
    dtypes = dtypes_after_a_step(lmconfig.model_config(shape, "model"), tc, VOCAB["vocab_size"])
    assert in_bf16(dtypes) == tables_and_moments("transformer.wte.weight", "value_embeds.0.weight")
    assert set(dtypes.values()) == {torch.bfloat16, torch.float32}


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("shard", ["always", "never"])
def test_bf16_tables_refuse_a_head_tied_to_the_token_embedding(shard):
    from lmpipe.train.loop import training_model

    tc = lmconfig.train_config(TRAIN | {"fsdp": {"shard": shard}} | BF16_TABLES, "train")
    gpt2 = lmconfig.model_config(SHAPE | VOCAB, "model")  # GPT-2's head is its token embedding
    with pytest.raises(ValueError, match=r"transformer.wte.weight is tied to lm_head.weight"):
        training_model(gpt2, tc, torch.device("cpu"))


@pytest.mark.usefixtures("one_rank_group")
def test_bf16_tables_of_hugging_face_models(tmp_path):
    """Every nn.Embedding of an `arch: hf` model too: a Llama's (untied) token embedding trains
    in bf16 beside its fp32 head; Qwen2's and GPT-2's heads are their token embeddings, refused."""
    from hf_models import make_model

    from lmpipe.train.loop import training_model

    tc = lmconfig.train_config(TRAIN | BF16_TABLES | {"seq_len": 32, "batch_tokens": 64}, "train")

    def hf(family: str):
        folder = make_model(family, tmp_path / family)
        return lmconfig.model_config({"arch": "hf", "path": str(folder)}, "models.m")

    dtypes = dtypes_after_a_step(hf("llama"), tc, 100)
    assert in_bf16(dtypes) == tables_and_moments("hf.model.embed_tokens.weight")
    for family, tied in (("qwen2", "hf.model.embed_tokens.weight"), ("gpt2", "hf.transformer.wte")):
        with pytest.raises(ValueError, match=rf"{tied}.* is tied to hf.lm_head.weight"):
            training_model(hf(family), tc, torch.device("cpu"))
