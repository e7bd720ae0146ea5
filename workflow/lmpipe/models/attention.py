"""Self-attention's one switch, shared by the architectures: causal, or under a given mask."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Attention of (B, nh, T, hs) queries, keys and values: causal without a mask (training,
    generation); with one, (B, 1, T, T) bool, True where a query may attend, under it (packed
    scoring rows: lmpipe.eval.packing)."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
