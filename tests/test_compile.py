"""train.compile's scopes (lmpipe.train.parallel) on the CPU's Inductor, through the trainer's
own model (lmpipe.train.loop.training_model) on one FSDP2 rank: the stem, the blocks and the
tail (final norm -> LM head -> loss) compiled as regions train as the eager model does, and the
embeddings and the final norm really run inside compiled graphs; the whole model compiled as one
graph trains as per-block compile does. Tiny models and few steps: Inductor on 2 cores is slow."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from lmpipe.config import model_config, train_config
from lmpipe.train.loop import training_model
from lmpipe.train.optim import build_optimizer

# Inductor compiles (~3 min cold on 2 cores); FSDP2 on one rank (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_rank_group")]

CPU = torch.device("cpu")
SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}
VOCAB = {"vocab_size": 320, "padded_vocab_size": 384}
STEPS = 2
# the modules whose forward must run inside a compiled graph under `regions`, by architecture
BLOCKS = ("transformer.h.0.ln_1", "transformer.h.1.ln_1")
WATCHED = {
    "gpt2": ("transformer.wte", "transformer.wpe", *BLOCKS, "transformer.ln_f"),
    "modern": ("transformer.wte", "transformer.ln_e", *BLOCKS, "transformer.ln_f"),
}


def count(module: torch.nn.Module, args: tuple, ran: torch.Tensor) -> None:
    """A forward pre-hook: 1 added to ran[0] where Dynamo traced the hook into a graph
    (torch.compiler.is_compiling() is then a constant True, and the add runs with the graph
    each time), else to ran[1]. A tensor's values are never guarded: counting recompiles
    nothing."""
    ran[0 if torch.compiler.is_compiling() else 1] += 1


def train(
    arch: str, compile: bool, scope: str = "regions", chunk: int = 0, steps: int = STEPS,
    sparse: bool = False,
) -> dict:  # fmt: skip
    """`steps` AdamW steps of a tiny `arch` model as the trainer builds it: each step's loss and
    gradients (before the update), and for each watched module how many of its forwards ran
    inside a compiled graph and how many eagerly. `sparse`: fine-tuning's head on the counted
    targets only, more of them each step."""
    torch._dynamo.reset()  # no graph of an earlier model is reused or counted
    tc = train_config(
        {
            "seq_len": 32, "micro_batch": 2, "batch_tokens": 64, "max_steps": steps,
            "optimizer": {"name": "adamw", "lr": 1e-3}, "compile": compile,
            "compile_scope": scope, "loss_chunk_tokens": chunk,
        },
        "train",
    )  # fmt: skip
    config = model_config(SHAPE | VOCAB | {"arch": arch}, "model")
    model, _ = training_model(config, tc, CPU, sparse_targets=sparse)
    counts = {name: torch.zeros(2, dtype=torch.long) for name in WATCHED[arch]}
    for name in WATCHED[arch]:
        model.get_submodule(name).register_forward_pre_hook(partial(count, ran=counts[name]))
    optimizer = build_optimizer(model, tc.optimizer)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB["vocab_size"], (steps, 2, 33), generator=g)
    targets = idx[:, :, 1:].clone()
    if sparse:  # a prompt of 20, 18, 16, ... positions that do not count
        for step in range(steps):
            targets[step, :, : 20 - 2 * step] = -1
    losses, grads = [], []
    for step in range(steps):
        _, loss = model(idx[step, :, :-1], targets[step])
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.full_tensor().clone() for n, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    traced = {name: (int(c[0]), int(c[1])) for name, c in counts.items()}  # (compiled, eager)
    return {"losses": losses, "grads": grads, "traced": traced, "compiled": model.compiled}


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
    """Each watched module ran inside a compiled graph at every step, never eagerly; in the
    eager model, eagerly at every step."""
    arch, eager, compiled = regions
    for name, ran in compiled["traced"].items():
        assert ran == (STEPS, 0), f"{arch}: {name} ran (compiled, eager) {ran} times"
    for name, ran in eager["traced"].items():
        assert ran == (0, STEPS), name


@pytest.mark.parametrize("arch", ["gpt2", "modern"])
def test_the_whole_model_compiled_trains_as_per_block_compile(arch):
    blocks = train(arch, compile=True, scope="blocks")
    whole = train(arch, compile=True, scope="model")
    assert blocks["compiled"] == ("blocks",) and whole["compiled"] == ("model",)
    assert_trains_alike(whole, blocks)
    # one graph: the stem and the final norm inside it too; per block, they run eagerly
    assert all(ran == (STEPS, 0) for ran in whole["traced"].values()), whole["traced"]
    assert blocks["traced"]["transformer.ln_f"] == (0, STEPS)


def test_the_chunked_loss_under_compiled_regions_trains_as_eager():
    """The chunked loss keeps its own compiled step and its loop eager (lmpipe.models.
    head_loss); the tail region ends at its call, the final norm inside."""
    eager = train("gpt2", compile=False, chunk=24)
    compiled = train("gpt2", compile=True, scope="regions", chunk=24)
    assert_trains_alike(compiled, eager)
    assert compiled["traced"]["transformer.ln_f"] == (STEPS, 0)


@pytest.mark.parametrize("chunk", [0, 16])
def test_the_counted_only_head_under_compiled_regions_trains_as_eager(chunk):
    """Fine-tuning: a count of positions that changes each step reaches the loss. The tail's
    graph ends at the selection and the loss takes the count as a symbol (the chunked loss: its
    own compiled step, its loop eager), so no graph recompiles each step (a fourth compile of
    one function is an error here)."""
    eager = train("gpt2", compile=False, chunk=chunk, steps=5, sparse=True)
    with torch._dynamo.config.patch(recompile_limit=3, fail_on_recompile_limit_hit=True):
        compiled = train("gpt2", compile=True, chunk=chunk, steps=5, sparse=True)
    assert_trains_alike(compiled, eager)
    assert compiled["traced"]["transformer.ln_f"] == (5, 0)


# a modern model's growing window (speedrun-124m's schedule, scaled): 1, 2, 3 blocks of 128,
# within documents (GPT-2's vocabulary: its end-of-text token starts one)
WINDOWED = SHAPE | {
    "arch": "modern", "vocab_size": 50257, "padded_vocab_size": 50304, "block_size": 512,
    "document_mask": True, "attention_window": 128, "attention_window_final": 384,
}  # fmt: skip


@pytest.mark.filterwarnings("ignore::UserWarning")  # flex_attention unfused on the CPU
@pytest.mark.parametrize(
    "attention, scope, grad, precision",
    [
        ("sdpa", "model", True, {}),
        # the speedrun's: bf16, the embedding tables an FSDP unit of their own (graph breaks at
        # its hooks split the stem: no piece may recompile either)
        ("flex", "regions", False, {"dtype": "bfloat16", "embedding_dtype": "bfloat16"}),
    ],
    ids=["sdpa-mask-whole-model", "flex-regions-validation-bf16-tables"],
)
def test_the_growing_window_compiles_nothing_new(monkeypatch, attention, scope, grad, precision):
    """Over a window's growth (the progress the loop sets: 1, 2, then 3 blocks) the compiled
    graphs are those of the first forward: the window is a tensor the graphs read, never a
    constant they guard on. Counted on the CPU's Inductor (Dynamo's unique graphs), two ways
    the window reaches a graph: the SDPA mask built inside the whole model's graph (a training
    step: forward and backward); FlexAttention's BlockMask (CUDA's path, here
    attention.FLEX_OFF_CUDA) handed to each compiled block (forward only: the CPU's Inductor
    compiles FlexAttention's forward, not its backward; validation's forwards)."""
    from lmpipe.models import attention as attention_module
    from lmpipe.models.modern import model as model_module

    monkeypatch.setattr(attention_module, "FLEX_OFF_CUDA", attention == "flex")
    torch._dynamo.reset()
    tc = train_config(
        {"seq_len": 512, "micro_batch": 1, "batch_tokens": 512, "max_steps": 4,
         "optimizer": {"name": "adamw", "lr": 1e-3}, "compile": True, "compile_scope": scope}
        | precision,
        "train",
    )  # fmt: skip
    model, _ = training_model(model_config(WINDOWED, "model"), tc, CPU)
    masks = []  # the BlockMasks built (eagerly, between the compiled blocks)
    real_mask = model_module.document_window_block_mask

    def recording(idx, document, window_blocks):
        masks.append(window_blocks)
        return real_mask(idx, document, window_blocks)

    monkeypatch.setattr(model_module, "document_window_block_mask", recording)
    graphs = torch._dynamo.utils.counters["stats"]
    idx = torch.randint(0, 50257, (1, 513), generator=torch.Generator())
    idx[0, [0, 100, 300]] = model_module.EOT
    first, seen = None, []
    for progress in (0.0, 0.0, 0.5, 0.5, 1.0, 1.0):
        model.progress = progress
        with torch.set_grad_enabled(grad):
            _, loss = model(idx[:, :-1], idx[:, 1:])
            if grad:
                loss.backward()
        seen.append(int(model.window_blocks))
        first = graphs["unique_graphs"] if first is None else first
    assert seen == [1, 1, 2, 2, 3, 3]  # the window grew
    assert graphs["unique_graphs"] == first, f"{graphs['unique_graphs'] - first} recompiles"
    assert first > 0  # something was compiled: the counter counts
    # FlexAttention's path really ran, on the model's tensor; the whole model's mask is built
    # inside its graph (SDPA's: not a BlockMask)
    want = [model.window_blocks] * 6 if attention == "flex" else []
    assert len(masks) == len(want) and all(w is m for w, m in zip(want, masks, strict=True))
