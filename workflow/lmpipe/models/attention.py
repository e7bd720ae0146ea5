"""Self-attention's one switch, shared by the architectures: causal, or under a given mask, with
the SDPA backend `train.attention_backend` chose (torch.nn.attention.sdpa_kernel); and which
kernel SDPA then ran, read off torch.profiler (`kernel_that_runs`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

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


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Attention of (B, nh, T, hs) queries, keys and values: causal without a mask (training,
    generation); with one, (B, 1, T, T) bool, True where a query may attend, under it (packed
    scoring rows: lmpipe.eval.packing)."""
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
    """The SDPA kernel that one call of `forward` runs attention on, as torch.profiler names its
    aten op (several joined by ", "; "none" where no attention went through SDPA): what ran,
    where train.attention_backend is what was asked."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward()
    return ", ".join(kernel_ops(prof.events())) or "none"
