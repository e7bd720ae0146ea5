"""The LM head and the cross-entropy, the biggest op of a small model: plain, or in chunks.

`linear_cross_entropy` is the plain form: the (N, V) fp32 logits of N positions are made, then
the loss; autograd keeps them (and their softmax) for the backward. For GPT-2 124M at 64K tokens
a micro-step that is 64K x 50,257 x 4 bytes = 13 GB, twice.

`ChunkedLinearCrossEntropy` never holds more than `chunk` rows of logits: it runs the head, the
loss and the loss's gradients chunk by chunk in the forward (the gradient of a cross-entropy is
softmax - one-hot, known once the logits are), keeps only dL/dx (N, C) and dL/dW (V, C), and the
backward scales them by the incoming gradient. The same idea as Liger-Kernel's fused linear
cross-entropy and Apple's cut-cross-entropy, in plain PyTorch: each chunk's step is ordinary ops,
which torch.compile fuses (`loss_function(..., compile=True)`).

`train.loss_kernel` names a fused Triton kernel instead, on CUDA only (LOSS_KERNELS): Liger-Kernel's
`LigerFusedLinearCrossEntropyLoss` (linkedin/Liger-Kernel) or Apple's cut-cross-entropy
(`cut_cross_entropy.linear_cross_entropy`, apple/ml-cross-entropy), each imported on first use,
each with the soft cap and the ignored targets as its own arguments.

All: targets of -1 do not count; the mean is over the counted targets; `weight` may hold padding
rows past `vocab_size` (llm.c's 50,304), whose logits are dropped before the softmax; an optional
soft cap (cap * tanh(logits / cap), the modern architecture's) before the softmax.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[..., torch.Tensor]  # (x, weight, targets, vocab_size, softcap) -> mean loss
# train.loss_kernel's fused kernels: (module imported, the package that installs it)
LOSS_KERNELS = {
    "liger": ("liger_kernel", "liger-kernel==0.8.5"),
    "cut_cross_entropy": ("cut_cross_entropy", "cut-cross-entropy==25.1.1"),
}


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(logits / cap): logits bounded to (-cap, cap); unchanged without a cap."""
    return logits if cap is None else cap * torch.tanh(logits / cap)


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    softcap: float | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of the fp32 logits x @ weight.T over the first `vocab_size` columns,
    soft-capped where `softcap` is set; targets of -1 are ignored."""
    logits = F.linear(x, weight)  # (..., Vp)
    if logits.size(-1) != vocab_size:
        logits = logits[..., :vocab_size]
    logits = soft_cap(logits.float(), softcap)  # fp32 for a stable softmax
    return F.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1), ignore_index=-1)


def chunk_step(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk of n rows: (summed loss over its counted targets, dL/dx (n, C), dL/dW (Vp, C)),
    the gradients of that sum. Ordinary ops, so torch.compile can fuse them."""
    logits = F.linear(x, weight).float()  # (n, Vp)
    z = logits[:, :vocab_size]
    capped = soft_cap(z, softcap)
    counted = targets != -1
    safe = torch.where(counted, targets, 0)
    lse = torch.logsumexp(capped, dim=-1)
    picked = capped.gather(1, safe[:, None]).squeeze(1)
    loss = ((lse - picked) * counted).sum()
    # d(loss)/d(capped) = softmax - one-hot, on counted rows only
    grad = torch.exp(capped - lse[:, None])
    grad = grad.scatter_add(1, safe[:, None], -torch.ones_like(grad[:, :1]))
    grad = grad * counted[:, None]
    if softcap is not None:  # d(cap tanh(z / cap))/dz = 1 - tanh^2
        grad = grad * (1 - (capped / softcap) ** 2)
    if logits.size(1) != vocab_size:  # the padding rows' logits were dropped: zero gradient
        grad = F.pad(grad, (0, logits.size(1) - vocab_size))
    grad = grad.to(x.dtype)
    return loss, grad @ weight, grad.t() @ x


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """linear_cross_entropy without the full logits (module docstring)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        vocab_size: int,
        softcap: float | None,
        chunk: int,
        step: Callable,
    ) -> torch.Tensor:
        shape = x.shape
        x, targets = x.reshape(-1, shape[-1]), targets.reshape(-1)
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        grad_x = torch.empty_like(x)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, x.size(0), chunk):
            rows = slice(start, start + chunk)
            loss, gx, gw = step(x[rows], weight, targets[rows], vocab_size, softcap)
            total += loss
            grad_x[rows] = gx
            grad_w += gw
        counted = (targets != -1).sum()  # 0 counted: 0 / 0 = nan, as F.cross_entropy gives
        ctx.save_for_backward(grad_x.reshape(shape), grad_w, counted)
        ctx.weight_dtype = weight.dtype
        return total / counted

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        grad_x, grad_w, counted = ctx.saved_tensors
        scale = grad_out / counted
        grad_w = (grad_w * scale).to(ctx.weight_dtype)
        return (grad_x * scale).to(grad_x.dtype), grad_w, None, None, None, None, None


def kernel_problem(kernel: str, device_type: str) -> str | None:
    """Why train.loss_kernel `kernel` cannot run on `device_type` here (None: it can), in one
    line: a fused kernel is Triton's, CUDA only, and its package must be installed."""
    if kernel == "pytorch":
        return None
    if device_type != "cuda":  # as lmpipe.config.loss_kernel_problem says it to a config
        return (
            f"train.loss_kernel {kernel!r} is a Triton kernel: launch.device cuda only (here"
            f" {device_type}); pytorch runs anywhere"
        )
    module, package = LOSS_KERNELS[kernel]
    if importlib.util.find_spec(module) is None:
        return f"train.loss_kernel {kernel!r}: {module} is not installed (pip install {package})"
    return None


def fused_loss(kernel: str) -> LossFn:
    """train.loss_kernel's fused head + loss, imported now: the padding rows past vocab_size
    cut from the weight, (..., C) positions flattened; never traced by a compiled region (its
    Triton kernels and autograd.Function run as they are)."""
    if kernel == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        def fused(x, weight, targets, vocab_size, softcap=None):
            # the weight's gradient summed over the positions in fp32, as the chunked one's
            loss = LigerFusedLinearCrossEntropyLoss(
                ignore_index=-1, softcap=softcap, accum_dtype=torch.float32
            )
            return loss(weight[:vocab_size], x.reshape(-1, x.size(-1)), targets.reshape(-1))
    else:
        from cut_cross_entropy import linear_cross_entropy as cce

        def fused(x, weight, targets, vocab_size, softcap=None):
            return cce(
                x.reshape(-1, x.size(-1)), weight[:vocab_size], targets.reshape(-1),
                ignore_index=-1, softcap=softcap,
            )  # fmt: skip

    fused = torch.compiler.disable(fused)
    fused.kernel = kernel  # what the trainer's provenance.json reads back
    return fused


def loss_function(
    chunk_tokens: int, compile: bool, kernel: str = "pytorch", device_type: str = "cpu"
) -> LossFn:
    """The head + loss a model trains with: plain (chunk_tokens 0) or in chunks of that many
    positions; compiled where `compile` (the plain one whole, the chunked one's step); or a
    fused kernel (`kernel`, train.loss_kernel: refused in one line where it cannot run).

    Uncompiled, the plain one is traced into whatever compiled region calls it (the model's
    tail, lmpipe.train.parallel). The compiled chunked one is never traced by an enclosing
    region (torch.compiler.disable): its loop over chunks would unroll into that region's graph,
    and with a count of positions that changes each step (fine-tuning's counted-only head)
    recompile each step; its step is compiled on its own instead."""
    if kernel != "pytorch":
        problem = kernel_problem(kernel, device_type)
        if problem is not None:
            raise ValueError(problem)
        return fused_loss(kernel)
    if chunk_tokens <= 0:
        return torch.compile(linear_cross_entropy) if compile else linear_cross_entropy
    step = torch.compile(chunk_step) if compile else chunk_step

    def chunked(x, weight, targets, vocab_size, softcap=None):
        return ChunkedLinearCrossEntropy.apply(
            x, weight, targets, vocab_size, softcap, chunk_tokens, step
        )

    if compile:
        chunked = torch.compiler.disable(chunked)
    chunked.chunk_tokens = chunk_tokens  # what the trainer's provenance.json reads back
    return chunked
