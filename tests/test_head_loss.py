"""The LM head + loss in chunks (lmpipe.models.head_loss) against the plain one, and activation
checkpointing (lmpipe.train.parallel.recompute_blocks) against none: equal losses and gradients,
less kept for the backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmpipe.models import build_model
from lmpipe.models.head_loss import linear_cross_entropy, loss_function
from lmpipe.train.parallel import parallelize

pytestmark = pytest.mark.usefixtures("one_rank_group")  # FSDP2/DCP: tests/conftest.py

V, VP, C = 1000, 1024, 48  # a vocabulary padded to a multiple of 128, as llm.c pads 50,257


def reference(x, weight, targets, softcap=None):
    """The loss and its gradients in float64, from F.cross_entropy and autograd, written apart
    from the code under test."""
    x = x.double().detach().requires_grad_()
    w = weight.double().detach().requires_grad_()
    logits = (x @ w.t())[..., :V]
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)
    loss.backward()
    return loss, x.grad, w.grad


def inputs(seed: int = 0, rows: int = 2, cols: int = 37):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, C, generator=g)
    weight = torch.randn(VP, C, generator=g) * 0.2
    targets = torch.randint(0, V, (rows, cols), generator=g)
    targets[0, :5] = -1  # positions that do not count (prompts, padding)
    return x, weight, targets


@pytest.mark.parametrize("softcap", [None, 15.0])
@pytest.mark.parametrize("chunk", [7, 32, 1000])  # uneven, a few, all rows in one chunk
def test_chunked_loss_and_gradients_equal_the_plain_ones(softcap, chunk):
    x, weight, targets = inputs()
    want_loss, want_gx, want_gw = reference(x, weight, targets, softcap)
    for loss_fn in (linear_cross_entropy, loss_function(chunk, compile=False)):
        xg, wg = x.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = loss_fn(xg, wg, targets, V, softcap)
        (2.5 * loss).backward()  # an incoming gradient other than 1 (accumulation scales it)
        torch.testing.assert_close(loss.double(), want_loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(xg.grad.double(), 2.5 * want_gx, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(wg.grad.double(), 2.5 * want_gw, rtol=1e-4, atol=1e-6)
        assert wg.grad[V:].abs().max() == 0  # the padding rows are never predicted


def test_chunked_loss_of_nothing_counted_is_nan_as_the_plain_one():
    x, weight, targets = inputs()
    targets[:] = -1
    assert torch.isnan(loss_function(8, compile=False)(x, weight, targets, V))
    assert torch.isnan(linear_cross_entropy(x, weight, targets, V))


def test_chunked_loss_keeps_no_full_logits():
    """What autograd keeps for the backward: the plain head keeps the (N, V) fp32 logits; the
    chunked one dL/dx and dL/dW only, whatever N."""
    x, weight, targets = inputs(rows=4, cols=256)  # N = 1024 positions
    kept = {}
    for name, loss_fn in (("plain", linear_cross_entropy), ("chunked", loss_function(64, False))):
        sizes: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t, sizes=sizes: sizes.append(t.numel() * t.element_size()) or t, lambda t: t
        ):
            loss_fn(x.clone().requires_grad_(), weight.clone().requires_grad_(), targets, V)
        kept[name] = sum(sizes)
    logits_bytes = 4 * 256 * V * 4
    assert kept["plain"] >= logits_bytes
    assert kept["chunked"] < logits_bytes / 4  # dL/dx (N, C) + dL/dW (Vp, C), fp32


def test_compiled_chunked_loss_equals_the_plain_one():
    x, weight, targets = inputs()
    xa, wa = x.clone().requires_grad_(), weight.clone().requires_grad_()
    xb, wb = x.clone().requires_grad_(), weight.clone().requires_grad_()
    linear_cross_entropy(xa, wa, targets, V).backward()
    loss_function(32, compile=True)(xb, wb, targets, V).backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(wb.grad, wa.grad, rtol=1e-4, atol=1e-6)


# ---- activation checkpointing --------------------------------------------------------------

MODELS = {
    "gpt2": {"arch": "gpt2", "n_layer": 3, "n_head": 2, "n_embd": 32, "block_size": 64},
    "modern": {"arch": "modern", "n_layer": 3, "n_head": 2, "n_embd": 32, "block_size": 64},
}


class CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten ops run while active (here: in the backward, where recompute re-runs the
    forward's ops)."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def step(arch: str, mode: str, chunk: int = 0):
    """A tiny model's loss, its gradients, the bytes autograd keeps outside recomputed blocks,
    and the ops the backward runs, on one FSDP rank with `mode` recompute."""
    from lmpipe.config import model_config

    torch.manual_seed(0)
    shape = MODELS[arch] | {"vocab_size": 320, "padded_vocab_size": 384}
    model = build_model(model_config(shape, "model"))
    model.loss_fn = loss_function(chunk, compile=False)
    model = parallelize(model, torch.device("cpu"), "float32", False, activation_checkpointing=mode)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 320, (4, 64), generator=g)
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: sizes.append(t.numel() * t.element_size()) or t, lambda t: t
    ):
        _, loss = model(idx[:, :-1], idx[:, 1:])
    with CountOps() as ops:
        loss.backward()
    grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
    names = [n for n, _ in model.named_parameters()]
    return loss.item(), grads, sum(sizes), names, ops.counts


@pytest.mark.parametrize("arch", ["gpt2", "modern"])
def test_recompute_gives_equal_loss_and_gradients(arch):
    loss, grads, kept, names, _ = step(arch, "none")
    assert not any("checkpoint" in n for n in names)  # the parameters' names as they were
    for mode in ("full", "selective"):
        loss_m, grads_m, kept_m, names_m, _ = step(arch, mode)
        assert names_m == names
        assert loss_m == pytest.approx(loss, rel=1e-6)
        for n in grads:
            torch.testing.assert_close(grads_m[n], grads[n], rtol=1e-5, atol=1e-7, msg=n)
        assert kept_m < kept / 2  # the blocks' activations are not kept as autograd's


def test_recompute_reruns_the_forward_selective_but_its_matmuls():
    """In the backward: no forward op without recompute; full re-runs the blocks' GELUs and
    their linear layers (addmm: a forward op, the backward's own products are mm); selective
    re-runs the GELUs but keeps the linear layers' and attention's outputs."""
    ran = {mode: step("gpt2", mode)[4] for mode in ("none", "full", "selective")}
    assert ran["none"].get("gelu", 0) == 0 and ran["none"].get("addmm", 0) == 0
    # 3 of a block's 4 linear layers: the recompute stops once it has what the backward needs
    # (torch.utils.checkpoint's early stop: the MLP's output projection is not re-run)
    assert ran["full"]["gelu"] == 3 and ran["full"]["addmm"] == 3 * 3
    assert ran["selective"]["gelu"] == 3 and ran["selective"].get("addmm", 0) == 0
    attention = [
        op
        for op in ran["full"]
        if op.startswith("_scaled_dot_product") and not op.endswith("_backward")
    ]
    assert attention and not any(ran["selective"].get(op) for op in attention)


def test_chunked_loss_in_a_model_equals_the_plain_one():
    loss, grads, *_ = step("modern", "none")  # the modern head soft-caps its logits
    loss_c, grads_c, *_ = step("modern", "none", chunk=50)
    assert loss_c == pytest.approx(loss, rel=1e-6)
    for n in grads:
        torch.testing.assert_close(grads_c[n], grads[n], rtol=1e-4, atol=1e-7, msg=n)


# ---- train.loss_kernel: the fused Triton kernels (CUDA only) -----------------------------------


@pytest.mark.parametrize("kernel", ["liger", "cut_cross_entropy"])
def test_a_fused_kernel_is_refused_in_one_line_where_it_cannot_run(kernel):
    """On the CPU: a Triton kernel, CUDA only; on CUDA without its package (the CPU env installs
    neither: each pulls Triton): the package to install, pinned."""
    from lmpipe.models.head_loss import LOSS_KERNELS

    with pytest.raises(ValueError) as refused:
        loss_function(0, False, kernel, "cpu")
    assert str(refused.value) == (
        f"train.loss_kernel '{kernel}' is a Triton kernel: launch.device cuda only (here cpu);"
        " pytorch runs anywhere"
    )
    module, package = LOSS_KERNELS[kernel]
    with pytest.raises(ValueError) as refused:
        loss_function(0, False, kernel, "cuda")
    assert str(refused.value) == (
        f"train.loss_kernel '{kernel}': {module} is not installed (pip install {package})"
    )


def stand_in(monkeypatch, kernel: str) -> list:
    """A stand-in for the kernel's package, with the call its documentation gives (Liger:
    LigerFusedLinearCrossEntropyLoss(ignore_index, softcap, accum_dtype)(lin_weight, _input,
    target); cut-cross-entropy: linear_cross_entropy(e, c, targets, ignore_index, softcap)),
    computing with PyTorch's cross-entropy over the weight it is given: what reaches the kernel.
    Returns the calls' (weight rows, input shape) seen."""
    import sys
    import types

    from lmpipe.models import head_loss

    seen = []

    def loss(e, c, targets, ignore_index=-100, softcap=None):
        seen.append((c.shape[0], tuple(e.shape)))
        logits = e @ c.t()
        logits = logits if softcap is None else softcap * torch.tanh(logits / softcap)
        return F.cross_entropy(logits, targets, ignore_index=ignore_index)

    if kernel == "liger":

        class Liger(torch.nn.Module):  # noqa: N801
            def __init__(self, ignore_index=-100, softcap=None, accum_dtype=None):
                super().__init__()
                self.args = ignore_index, softcap

            def forward(self, lin_weight, _input, target, bias=None):
                return loss(_input, lin_weight, target, *self.args)

        package = types.ModuleType("liger_kernel")
        package.transformers = types.ModuleType("liger_kernel.transformers")
        package.transformers.LigerFusedLinearCrossEntropyLoss = Liger
        monkeypatch.setitem(sys.modules, "liger_kernel", package)
        monkeypatch.setitem(sys.modules, "liger_kernel.transformers", package.transformers)
    else:
        package = types.ModuleType("cut_cross_entropy")
        package.linear_cross_entropy = loss
        monkeypatch.setitem(sys.modules, "cut_cross_entropy", package)
    monkeypatch.setattr(head_loss, "kernel_problem", lambda kernel, device: None)
    return seen


@pytest.mark.parametrize("kernel", ["liger", "cut_cross_entropy"])
@pytest.mark.parametrize("softcap", [None, 15.0])
def test_a_fused_kernel_gets_the_real_vocabulary_flat_positions_and_the_ignored_targets(
    monkeypatch, kernel, softcap
):
    """What the adapter hands a fused kernel (a stand-in for its package, its documented call):
    the weight cut to vocab_size (the padding rows never scored), the (B, T, C) positions as
    (B T, C), -1 as the ignored index, the soft cap: the loss and gradients are the reference's.
    The kernels themselves run on CUDA only (gpu_check times them)."""
    seen = stand_in(monkeypatch, kernel)
    x, weight, targets = inputs(3)
    fused = loss_function(0, False, kernel, "cuda")
    assert fused.kernel == kernel
    x, weight = x.requires_grad_(), weight.requires_grad_()
    loss = fused(x, weight, targets, V, softcap)
    loss.backward()
    want, gx, gw = reference(x, weight, targets, softcap)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), gx, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(weight.grad.double(), gw, rtol=1e-4, atol=1e-6)
    assert seen == [(V, (2 * 37, C))]
