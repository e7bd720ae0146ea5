"""One gradient reduction a step: the trainer's micro-steps (lmpipe.train.loop.accumulate_gradients)
on the trainer's own model (training_model: FSDP2 over 2 real gloo ranks) reduce-scatter each FSDP
unit's gradients once a step, not once a micro-step, and land on the gradients the reduction at
every micro-step gives; under train.dtype bfloat16 the blocks compute with bf16 weights and the
reduction carries fp32 (fsdp.reduce_dtype). The reductions are counted by wrapping the
torch.distributed function FSDP2's reduce-scatter calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from conftest import run_ranks_or_fail

RANKS = 2
ACCUM = 8  # micro-steps a step, as the 124m runs accumulate
SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "arch": "gpt2"}
VOCAB = {"vocab_size": 320, "padded_vocab_size": 384}
SEQ, MICRO = 32, 2
# (name, train.dtype, fsdp.reduce_each_micro_step)
RUNS = (("once", "float32", False), ("each", "float32", True), ("bf16", "bfloat16", False))
# FSDP2 reduce-scatters through torch.distributed.reduce_scatter_single in torch 2.13 and
# reduce_scatter_tensor before it; both are counted where they exist
REDUCE_SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor")


def count_reduce_scatters(calls: list[str]) -> None:
    """Wrap torch.distributed's reduce-scatters: each call appends its input's dtype."""
    for name in REDUCE_SCATTERS:
        real = getattr(dist, name, None)
        if real is None:
            continue

        def counted(*args, _real=real, **kwargs):
            given = kwargs.get("input", args[1] if len(args) > 1 else None)
            calls.append(str(given.dtype))
            return _real(*args, **kwargs)

        setattr(dist, name, counted)


def one_step(dtype: str, each: bool, rank: int) -> dict:
    """One step's gradients of the trainer's model, the reduce-scatters they took and the dtype
    the first block's attention weight computed in."""
    from lmpipe.config import model_config, train_config
    from lmpipe.train.loop import accumulate_gradients, training_model

    tc = train_config(
        {
            "seq_len": SEQ, "micro_batch": MICRO, "batch_tokens": SEQ * MICRO * RANKS * ACCUM,
            "max_steps": 1, "optimizer": {"name": "adamw", "lr": 1e-3}, "dtype": dtype,
            "fsdp": {"reduce_each_micro_step": each},
        },
        "train",
    )  # fmt: skip
    assert tc.grad_accum_steps(RANKS) == ACCUM
    model, _ = training_model(model_config(SHAPE | VOCAB, "model"), tc, torch.device("cpu"))
    seen: list[str] = []
    attn = model.blocks()[0].attn.c_attn
    attn.register_forward_pre_hook(lambda m, args: seen.append(str(m.weight.dtype)))
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own micro-batches

    def next_batch():
        tokens = torch.randint(0, VOCAB["vocab_size"], (MICRO, SEQ + 1), generator=gen)
        return tokens[:, :-1], tokens[:, 1:]

    calls: list[str] = []
    count_reduce_scatters(calls)
    accumulate_gradients(model, next_batch, ACCUM, torch.device("cpu"), each)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    return {"calls": calls, "weight_dtypes": sorted(set(seen)), "grads": grads}


def ranks(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    real = {name: getattr(dist, name) for name in REDUCE_SCATTERS if hasattr(dist, name)}
    results = {}
    for name, dtype, each in RUNS:
        results[name] = one_step(dtype, each, rank)
        for fn, f in real.items():  # unwrapped for the next run
            setattr(dist, fn, f)
    if rank == 0:
        torch.save({n: r["grads"] for n, r in results.items()}, Path(out) / "grads.pt")
    seen = {n: {k: r[k] for k in ("calls", "weight_dtypes")} for n, r in results.items()}
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grad_sync")
    run_ranks_or_fail(ranks, (str(out / "store"), str(out)), RANKS, timeout=300)
    return out


def test_one_reduce_scatter_a_unit_a_step_with_8_micro_steps(steps):
    """Each FSDP unit (each block, then the root: embeddings, final norm, head) reduce-scatters
    once a step; reducing at every micro-step, ACCUM times as often."""
    units = SHAPE["n_layer"] + 1
    for rank in range(RANKS):
        seen = json.loads((steps / f"rank{rank}.json").read_text())
        assert len(seen["once"]["calls"]) == units, seen["once"]
        assert len(seen["each"]["calls"]) == ACCUM * units  # the count sees every reduction
        assert len(seen["bf16"]["calls"]) == units


def test_gradients_equal_the_reduction_at_every_micro_step(steps):
    """The sum of the unreduced micro-steps' gradients, reduced once, is the sum of the
    micro-steps' reduced gradients up to the order of fp32 sums: within 1e-6 relative to each
    tensor's largest gradient (fp32's epsilon is 1.2e-7; 16 terms in another order)."""
    grads = torch.load(steps / "grads.pt", weights_only=True)
    once, each = grads["once"], grads["each"]
    assert once.keys() == each.keys()
    for name in once:
        scale = each[name].abs().max().item()
        assert scale > 0, name  # every parameter got a gradient
        torch.testing.assert_close(once[name], each[name], rtol=0, atol=1e-6 * scale, msg=name)


def test_bfloat16_computes_with_bf16_weights_and_reduces_in_fp32(steps):
    """train.dtype bfloat16 as the GPU runs it (FSDP2's MixedPrecisionPolicy): the blocks'
    weights gathered in bf16, the gradients reduce-scattered in fp32 (fsdp.reduce_dtype), and the
    sharded gradients the optimizer steps in fp32; fp32 runs compute in fp32."""
    seen = json.loads((steps / "rank0.json").read_text())
    assert seen["bf16"]["weight_dtypes"] == ["torch.bfloat16"]
    assert set(seen["bf16"]["calls"]) == {"torch.float32"}
    assert seen["once"]["weight_dtypes"] == ["torch.float32"]
    grads = torch.load(steps / "grads.pt", weights_only=True)
    assert {g.dtype for g in grads["bf16"].values()} == {torch.float32}
    # bf16 gradients are near the fp32 ones, not equal: the casts ran
    for name, g in grads["once"].items():
        assert not torch.equal(grads["bf16"][name], g), name
        scale = g.abs().max().item()
        torch.testing.assert_close(grads["bf16"][name], g, rtol=0, atol=0.1 * scale, msg=name)
