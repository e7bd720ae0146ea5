"""train.compile's scopes (lmpipe.train.parallel) on the CPU's Inductor, through the trainer's
own model (lmpipe.train.loop.training_model) on one FSDP2 rank: the stem, the blocks and the
tail (final norm -> LM head -> loss) compiled as regions train as the eager model does, and the
embeddings and the final norm really run inside compiled graphs; the whole model compiled as one
graph trains as per-block compile does. Tiny models and few steps: Inductor on 2 cores is slow."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from lmpipe.config import model_config, train_config
from lmpipe.train.loop import training_model
from lmpipe.train.optim import build_optimizer

pytestmark = pytest.mark.slow  # Inductor compiles: ~2 min cold on 2 cores

SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}
VOCAB = {"vocab_size": 320, "padded_vocab_size": 384}
STEPS = 2
# the modules whose forward must run inside a compiled graph under `regions`, by architecture
WATCHED = {
    "gpt2": ("transformer.wte", "transformer.wpe", "transformer.h.0.ln_1", "transformer.ln_f"),
    "modern": ("transformer.wte", "transformer.ln_e", "transformer.h.0.ln_1", "transformer.ln_f"),
}


@pytest.fixture(scope="module", autouse=True)
def process_group():
    """One rank, as lmpipe.train.parallel.init_distributed makes it without torchrun."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def train(arch: str, compile: bool, scope: str = "regions", chunk: int = 0) -> dict:
    """STEPS AdamW steps of a tiny `arch` model as the trainer builds it: each step's loss and
    gradients (before the update), and for each watched module whether each of its forwards
    ran while Dynamo traced (inside a compiled graph: torch.compiler.is_compiling) or not."""
    torch._dynamo.reset()  # no graph of an earlier model is reused or counted
    tc = train_config(
        {
            "seq_len": 32, "micro_batch": 2, "batch_tokens": 64, "max_steps": STEPS,
            "optimizer": {"name": "adamw", "lr": 1e-3}, "compile": compile,
            "compile_scope": scope, "loss_chunk_tokens": chunk,
        },
        "train",
    )  # fmt: skip
    model, _ = training_model(model_config(SHAPE | VOCAB | {"arch": arch}, "model"), tc, CPU)
    traced: dict[str, list[bool]] = {name: [] for name in WATCHED[arch]}
    for name in WATCHED[arch]:
        model.get_submodule(name).register_forward_pre_hook(
            lambda module, args, ran=traced[name]: ran.append(torch.compiler.is_compiling())
        )
    optimizer = build_optimizer(model, tc.optimizer)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB["vocab_size"], (STEPS, 2, 33), generator=g)
    losses, grads = [], []
    for step in range(STEPS):
        _, loss = model(idx[step, :, :-1], idx[step, :, 1:])
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.full_tensor().clone() for n, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"losses": losses, "grads": grads, "traced": traced, "compiled": model.compiled}


CPU = torch.device("cpu")


def assert_trains_alike(got: dict, want: dict) -> None:
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
    for step, (g, w) in enumerate(zip(got["grads"], want["grads"], strict=True)):
        assert g.keys() == w.keys()  # the parameters' names as they were (no _orig_mod.)
        for name in w:
            torch.testing.assert_close(g[name], w[name], rtol=1e-4, atol=1e-6, msg=f"{step} {name}")


@pytest.fixture(scope="module", params=["gpt2", "modern"])
def regions(request) -> tuple[str, dict, dict]:
    """An architecture, its eager run and its run with the regions compiled."""
    arch = request.param
    return arch, train(arch, compile=False), train(arch, compile=True, scope="regions")


def test_compiled_regions_train_as_eager(regions):
    arch, eager, compiled = regions
    assert compiled["compiled"] == ("blocks", "embed", "head_loss")
    assert eager["compiled"] == ()
    assert_trains_alike(compiled, eager)


def test_the_embeddings_and_final_norm_run_inside_compiled_graphs(regions):
    """Each watched module's forward ran only while Dynamo traced it into a graph (after the
    first trace the graph runs and the Python forward not at all), never eagerly; in the eager
    model, eagerly every step."""
    arch, eager, compiled = regions
    for name, ran in compiled["traced"].items():
        assert ran and all(ran), f"{arch}: {name} ran eagerly under compile_scope regions"
    for name, ran in eager["traced"].items():
        assert ran == [False] * STEPS, name


@pytest.mark.parametrize("arch", ["gpt2", "modern"])
def test_the_whole_model_compiled_trains_as_per_block_compile(arch):
    blocks = train(arch, compile=True, scope="blocks")
    whole = train(arch, compile=True, scope="model")
    assert blocks["compiled"] == ("blocks",) and whole["compiled"] == ("model",)
    assert_trains_alike(whole, blocks)
    # one graph: the stem and the final norm inside it too; per block, they run eagerly
    assert all(all(ran) for ran in whole["traced"].values())
    assert not any(blocks["traced"]["transformer.ln_f"])


def test_the_chunked_loss_under_compiled_regions_trains_as_eager():
    """The chunked loss keeps its own compiled step and its loop eager (lmpipe.models.
    head_loss); the tail region ends at its call, the final norm inside."""
    eager = train("gpt2", compile=False, chunk=24)
    compiled = train("gpt2", compile=True, scope="regions", chunk=24)
    assert_trains_alike(compiled, eager)
    assert all(compiled["traced"]["transformer.ln_f"])
