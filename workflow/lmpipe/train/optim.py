"""Optimizers (chosen by `train.optimizer.name`), the learning-rate schedule and gradient clipping.

An optimizer is a function `(model, settings) -> torch.optim.Optimizer` named by its entry in
lmpipe.registry.OPTIMIZERS, which also holds its settings. Each parameter group's `lr` at build
time is its peak; the loop sets every group's lr a step with `lr_at(step, peak, ...)`, so an
optimizer may give its groups different peaks and they share the schedule's shape.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from lmpipe.config import ScheduleConfig
from lmpipe.registry import OPTIMIZERS, AdamWSettings, code


def build_optimizer(model: torch.nn.Module, settings: Any) -> torch.optim.Optimizer:
    """The optimizer `settings.name` over `model`'s parameters (sharded or not)."""
    return code(OPTIMIZERS[settings.name].build)(model, settings)


def adamw(model: torch.nn.Module, s: AdamWSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on 2-D weights (matmuls, embeddings) only, not biases/norms."""
    params = list(model.parameters())  # a tied weight appears once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": s.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=s.lr, betas=s.betas, eps=s.eps, fused=s.fused)


def lr_at(step: int, peak: float, schedule: ScheduleConfig, max_steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine to the floor
    (or, with `schedule.cooldown_steps`, the peak, then linearly to the floor)."""
    if step < schedule.warmup_steps:
        return peak * (step + 1) / schedule.warmup_steps
    min_lr = peak * schedule.lr_floor
    if schedule.cooldown_steps:  # hold the peak, then linearly down to the floor at max_steps
        left = max_steps - step  # modded-nanogpt: lr x (num_iterations - it) / warmdown_iters
        return min_lr + (peak - min_lr) * min(1.0, left / schedule.cooldown_steps)
    decay_ratio = (step - schedule.warmup_steps) / max(1, max_steps - schedule.warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(decay_ratio, 1.0)))  # 1 -> 0
    return min_lr + coeff * (peak - min_lr)


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Global gradient norm over all shards (clipped to max_norm unless 0), as torchtitan does."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()  # sum of the ranks' partial norms
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm
