"""Self-attention's one switch, shared by the architectures: causal, or under a given mask, with
the SDPA backend `train.attention_backend` chose (torch.nn.attention.sdpa_kernel); or, under a
FlexAttention BlockMask (a modern model's document mask and sliding window on CUDA), torch's
flex_attention, compiled as modded-nanogpt's records run it; and which kernel then ran, read off
torch.profiler (`kernel_that_runs`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, flex_attention

# train.attention_backend -> the kernels SDPA may pick from (None: its own choice)
BACKENDS: dict[str, SDPBackend | None] = {
    "auto": None,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
CPU_BACKENDS = ("auto", "flash", "math")  # PyTorch's CPU has a flash kernel and math only
# the aten ops of SDPA's kernels share this prefix: _scaled_dot_product_flash_attention (and
# _for_cpu), _efficient_attention, _cudnn_attention, _attention_math; the op SDPA dispatches to
# (aten::scaled_dot_product_attention) does not have it
KERNEL_OP = "aten::_scaled_dot_product_"
_chosen: SDPBackend | None = None
FLEX_OFF_CUDA = False  # tests set it: FlexAttention's masks on the CPU too, eager (flex_on)
FLEX_KERNEL = "flex_attention"  # what kernel_that_runs names FlexAttention (no aten op of its own)
_flex_calls = 0  # flex's eager calls (kernel_that_runs reads it; compiled code never counts)


def backend_problem(name: str, device: torch.device) -> str | None:
    """Why backend `name` cannot run on `device` (None: it can), in one line."""
    if device.type != "cuda" and name not in CPU_BACKENDS:
        return (
            f"train.attention_backend {name!r} has no kernel on the {device.type}"
            f" (there: {', '.join(CPU_BACKENDS)})"
        )
    return None


def use_backend(name: str) -> None:
    """Every later `attend` in this process runs on backend `name` (the trainer sets it once)."""
    global _chosen
    _chosen = BACKENDS[name]


def flex_on(device: torch.device) -> bool:
    """Whether a model's own mask (document mask, sliding window) runs as FlexAttention on
    `device`: on CUDA, where its fused kernel skips the masked blocks; elsewhere SDPA under the
    boolean mask, the definition (FLEX_OFF_CUDA: FlexAttention eager there too, for tests)."""
    return device.type == "cuda" or FLEX_OFF_CUDA


@functools.cache
def compiled(fn: Callable) -> Callable:
    """torch.compile(fn), made once a process: flex_attention and create_block_mask on CUDA,
    as torch advises (eager, each materialises the dense scores or mask)."""
    return torch.compile(fn)


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: BlockMask) -> torch.Tensor:
    """flex_attention under `mask`, compiled on CUDA (as modded-nanogpt's records, whose model is
    torch.compile'd: unfused, eager flex_attention materialises the scores), eager elsewhere.
    q, k, v in one dtype: autocast's when on (SDPA casts so itself), else their common one."""
    global _flex_calls
    if not torch.compiler.is_compiling():  # a traced count would guard on it: a recompile a call
        _flex_calls += 1
    kind = q.device.type
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
    else:
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    run = compiled(flex_attention) if kind == "cuda" else flex_attention
    return run(q, k, v, block_mask=mask)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | BlockMask | None
) -> torch.Tensor:
    """Attention of (B, nh, T, hs) queries, keys and values: causal without a mask (training,
    generation); with one, (B, 1, T, T) bool, True where a query may attend, under it (packed
    scoring rows: lmpipe.eval.packing); with a BlockMask, FlexAttention under it (flex)."""
    if isinstance(mask, BlockMask):
        return flex(q, k, v, mask)
    kernel = sdpa_kernel(_chosen) if _chosen is not None else contextlib.nullcontext()
    with kernel:
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def kernel_ops(events: Iterable[Any]) -> list[str]:
    """The SDPA kernels' forward aten ops among torch.profiler events (`prof.events()`), e.g.
    aten::_scaled_dot_product_flash_attention; sorted, each once."""
    return sorted(
        {e.name for e in events if e.name.startswith(KERNEL_OP) and "backward" not in e.name}
    )


def kernel_that_runs(forward: Callable[[], Any]) -> str:
    """The attention kernel that one eager call of `forward` runs, as torch.profiler names SDPA's
    aten op, or FLEX_KERNEL where FlexAttention ran (several joined by ", "; "none" where no
    attention ran): what ran, where train.attention_backend is what was asked."""
    from torch.profiler import ProfilerActivity, profile

    flex_before = _flex_calls
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward()
    ops = kernel_ops(prof.events()) + ([FLEX_KERNEL] if _flex_calls > flex_before else [])
    return ", ".join(ops) or "none"
