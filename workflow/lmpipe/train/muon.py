"""Muon for the blocks' 2-D matrices, AdamW for the rest, as one optimizer (`train.optimizer:
{name: muon}`), and its Newton-Schulz step spread over the FSDP ranks.

Muon (Keller Jordan, https://kellerjordan.github.io/posts/muon/; modded-nanogpt's speedruns) keeps
a momentum of each matrix's gradient and steps along its orthogonalisation: the nearest
(semi-)orthogonal matrix, roughly U V^T of its SVD, found with a few quintic Newton-Schulz
iterations. The update of one matrix is torch.optim.Muon's (torch 2.13), op for op:

    buf <- lerp(buf, g, 1 - momentum);  u <- lerp(g, buf, momentum) if nesterov else buf
    p <- p (1 - lr wd) - lr sqrt(max(1, rows / cols)) NS(u)

(tests/test_optim.py holds it equal to torch's, bit for bit), but for NS's normalisation, the
speedrun record's (`newton_schulz`), which differs from torch's for a gradient near zero only.
Three groups, each with its own
peak `lr` (the loop scales every group by the schedule, lmpipe.train.optim.lr_at):

- `muon`: the 2-D parameters of `model.blocks()` (attention's and the MLP's weight matrices):
  `lr`, `weight_decay`;
- `adamw`, decayed: the other 2-D parameters (token and position embeddings, the LM head, tied to
  the token embedding in GPT-2): `adam_lr`, `adam_weight_decay`; with `embed_lr`, the token
  embedding in a group of its own at that lr (modded-nanogpt's 0.6 against the head's 0.008);
- `adamw`, not decayed: learned scalars, gains and biases (1-D): `adam_lr`, or `scalar_lr`
  where set (modded-nanogpt's 0.04).

One torch.optim.Optimizer with per-parameter state (`momentum_buffer`; AdamW's `step`,
`exp_avg`, `exp_avg_sq`) keeps the loop's schedule and DCP's optimizer state dict as they are for
AdamW: the state is checkpointed sharded and a resumed run continues bit for bit.

Sharding. Under FSDP2 (lmpipe.train.parallel) every parameter, its gradient and so its momentum
is a DTensor sharded on dim 0: each rank holds a block of rows. The momentum and AdamW are
elementwise and stay sharded. Newton-Schulz is not: X X^T mixes every row, and orthogonalising
each rank's rows on their own gives another matrix (rows orthonormal among themselves, not as a
whole), so torch.optim.Muon cannot run on the shards. Gathering every matrix on every rank
(`full_tensor()`) would repeat all the work on each. Instead, each optimizer step:

1. each matrix has an owner, a rank of the data-parallel group (the mesh dimension that shards
   the rows, `row_group`; on a mesh of more dimensions the others must replicate the matrices,
   and each of their ranks repeats the work of its data-parallel group), chosen by work: the
   largest matrices first, each to the rank with the least Newton-Schulz work so far
   (`owners_by_work`, from the shapes only: the same on every rank);
2. every rank sends its rows of each update to the owner (`dist.gather`, each shard padded to
   torch.chunk's row count, all matrices in flight at once): the owner holds the whole matrix;
3. each rank runs Newton-Schulz on the matrices it owns only: about 1/world_size of the work;
4. the owner sends each rank its rows of the result (`dist.scatter`), and every rank applies its
   own rows of the update.

Each matrix crosses the network twice, as an all-gather and a reduce-scatter of it would, in
Newton-Schulz's dtype (`ns_dtype`, bfloat16 by default: half the bytes of the fp32 update; the
result is the same, since Newton-Schulz starts by casting to it). A plain (unsharded) tensor is
its own whole matrix and needs no communication. One process under FSDP holds DTensors of one
shard and takes the same path with world size 1 (the gathers and scatters copy locally).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard
from torch.optim.adamw import adamw

from lmpipe.registry import MuonSettings

# Keller Jordan's quintic coefficients (torch.optim._muon's DEFAULT_A/B/C): they maximise the
# slope at zero, so 5 steps bring every singular value near 1 (to ~0.7-1.2, not exactly 1)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def newton_schulz(g: torch.Tensor, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """The orthogonalisation of a whole 2-D matrix `g`, in `dtype`: torch.optim._muon's
    `_zeropower_via_newtonschulz` (tested equal in bfloat16), which always computes in bfloat16;
    here float32 too (the CPU tests compare ranks in it). Normalised as the speedrun record's
    `zeropower_via_newtonschulz5`, X / (||X|| + 1e-7), where torch clamps the norm at 1e-7: the
    same but for matrices of norm near 1e-7 or less (a gradient nearly zero)."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:  # iterate on the smaller Gram matrix
        x = x.T
    x = x / (x.norm() + NS_EPS)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b A + c A^2) X
    return x.T if tall else x


def rows_of(n: int, world_size: int, rank: int) -> tuple[int, int]:
    """The rows [start, end) a rank holds of a dim-0 shard of n rows (torch.chunk's split, which
    DTensor's Shard(0) and FSDP2 use: ceil(n / world_size) rows a rank, the last ones fewer)."""
    per = math.ceil(n / world_size)
    start = min(rank * per, n)
    return start, min(start + per, n)


def newton_schulz_work(shape: tuple[int, ...]) -> int:
    """A matrix's Newton-Schulz multiply-adds an iteration, up to a constant: with m <= n its
    sides, X X^T and P X are m x m x n each, A A is m^3."""
    m, n = sorted(shape)
    return m * m * (2 * n + m)


def owners_by_work(shapes: list[tuple[int, ...]], world: int) -> list[int]:
    """Each matrix's owner rank: the largest first, each to the rank with the least work so far
    (ties: the lower rank), a function of the shapes only, so every rank finds the same. The
    most any rank gets is within one matrix of the mean (greedy "largest first"), where round
    robin gave the first ranks the large ones whenever the count is not a multiple of the world."""
    load, owners = [0] * world, [0] * len(shapes)
    for k in sorted(range(len(shapes)), key=lambda k: (-newton_schulz_work(shapes[k]), k)):
        r = min(range(world), key=lambda r: (load[r], r))
        owners[k] = r
        load[r] += newton_schulz_work(shapes[k])
    return owners


def _padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with zero rows added up to `rows` (gloo's gather and scatter want equal sizes)."""
    if t.shape[0] == rows:
        return t.contiguous()
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def row_group(updates: list[DTensor]) -> tuple[dist.ProcessGroup, int, int]:
    """The process group the matrices' rows are sharded over, its size and this rank in it: the
    data-parallel dimension of their mesh (FSDP's Shard(0)). Other dimensions must replicate
    the rows (HSDP's replicas, a tensor-parallel dimension that leaves these matrices whole):
    each of their ranks then orthogonalises the same matrices. What Muon cannot orthogonalise
    from gathered rows (columns split, rows split over two dimensions, a pending sum) is refused,
    naming the placements."""
    u = updates[0]
    mesh, placements = u.device_mesh, tuple(u.placements)
    rows = [d for d, p in enumerate(placements) if type(p) is Shard and p.dim == 0]
    whole = len(rows) == 1 and all(
        p.is_replicate() for d, p in enumerate(placements) if d != rows[0]
    )
    if not whole or any(
        (v.device_mesh, tuple(v.placements)) != (mesh, placements) for v in updates[1:]
    ):
        raise ValueError(
            f"muon: matrices sharded as {placements} over mesh {mesh.mesh_dim_names}; Muon"
            " gathers a matrix's rows over one mesh dimension (Shard(0)), the others"
            " replicating it, the same for every matrix"
        )
    d = rows[0]
    return mesh.get_group(d), mesh.size(d), mesh.get_local_rank(d)


def orthogonalise(
    updates: list[torch.Tensor], steps: int, dtype: torch.dtype
) -> list[torch.Tensor]:
    """Newton-Schulz of each whole update; returns this rank's rows of each (its local shard, in
    the update's dtype). Sharded updates are gathered on their owners (the module docstring)."""
    out: list[torch.Tensor | None] = [None] * len(updates)
    sharded = []
    for i, u in enumerate(updates):
        if isinstance(u, DTensor):
            sharded.append(i)
        else:
            out[i] = newton_schulz(u, steps, dtype).to(u.dtype)
    if not sharded:
        return out
    group, world, rank = row_group([updates[i] for i in sharded])
    # 1. the owners, by work: the same on every rank
    shares = owners_by_work([tuple(updates[i].shape) for i in sharded], world)
    owners = dict(zip(sharded, shares, strict=True))

    # 2. each owner gathers the shards of its matrices, in Newton-Schulz's dtype (its first op
    # casts to it: the same result, half the bytes in bfloat16)
    gathered, works = {}, []
    for i in sharded:
        u, owner = updates[i], owners[i]
        local = u.to_local()
        start, end = rows_of(u.shape[0], world, rank)
        assert local.shape[0] == end - start, (local.shape, u.shape, world)
        send = _padded(local.to(dtype), math.ceil(u.shape[0] / world))
        parts = [torch.empty_like(send) for _ in range(world)] if rank == owner else None
        works.append(dist.gather(send, parts, group=group, group_dst=owner, async_op=True))
        gathered[i] = parts
    for w in works:
        w.wait()

    # 3. the owner orthogonalises its whole matrices
    results = {}
    for i in sharded:
        if owners[i] == rank:
            u = updates[i]
            full = torch.cat(gathered[i])[: u.shape[0]]
            o = newton_schulz(full, steps, dtype)
            per = math.ceil(u.shape[0] / world)
            results[i] = list(_padded(o, per * world).split(per))

    # 4. and sends each rank its rows back, in that dtype too
    received, works = {}, []
    for i in sharded:
        u = updates[i]
        mine = torch.empty(math.ceil(u.shape[0] / world), *u.shape[1:], dtype=dtype,
                           device=u.to_local().device)  # fmt: skip
        works.append(
            dist.scatter(mine, results.get(i), group=group, group_src=owners[i], async_op=True)
        )
        received[i] = mine
    for w in works:
        w.wait()
    for i in sharded:
        start, end = rows_of(updates[i].shape[0], world, rank)
        out[i] = received[i][: end - start].to(updates[i].dtype)
    return out


class Muon(torch.optim.Optimizer):
    """Muon on the groups of kind "muon", AdamW (torch's functional adamw) on those of kind
    "adamw"; sharded (DTensor) or plain parameters."""

    def __init__(self, groups: list[dict[str, Any]], s: MuonSettings) -> None:
        defaults = {
            "momentum": s.momentum,
            "momentum_warmup_steps": s.momentum_warmup_steps,
            "momentum_start": s.momentum_start,
            "nesterov": s.nesterov,
            "ns_steps": s.ns_steps,
            "ns_dtype": s.ns_dtype,
            "betas": tuple(s.adam_betas),
            "eps": s.adam_eps,
        }
        super().__init__(groups, defaults)
        for group in self.param_groups:
            if group["kind"] == "muon" and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("muon: the Muon group holds 2-D matrices only")

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        assert closure is None, "muon: no closure"
        for group in self.param_groups:
            if group["kind"] == "muon":
                self._muon(group)
            else:
                self._adamw(group)

    def _muon(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        updates = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad)
            momentum = self._momentum(group, state)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - momentum)  # elementwise: on the shards
            updates.append(p.grad.lerp(buf, momentum) if group["nesterov"] else buf)
        dtype = getattr(torch, group["ns_dtype"])
        lr, wd = group["lr"], group["weight_decay"]
        for p, o in zip(params, orthogonalise(updates, group["ns_steps"], dtype), strict=True):
            rows, cols = p.shape
            local = p.to_local() if isinstance(p, DTensor) else p  # this rank's rows, in place
            local.mul_(1 - lr * wd)
            # Keller Jordan's scale (torch's adjust_lr_fn "original"): a tall matrix's update
            # has the RMS of a square one's
            local.add_(o, alpha=-lr * math.sqrt(max(1.0, rows / cols)))

    @staticmethod
    def _momentum(group: dict[str, Any], state: dict[str, Any]) -> float:
        """The momentum of this step: with a warmup, from momentum_start to momentum over its
        steps, linearly (modded-nanogpt's records: 0.85 -> 0.95 over 300), counted in the
        parameter's state (checkpointed with it, so a resumed run continues the ramp)."""
        warmup = group["momentum_warmup_steps"]
        if not warmup:  # no step count kept: the state's layout is torch.optim.Muon's
            return group["momentum"]
        step = int(state.setdefault("step", torch.tensor(0.0)).item())
        state["step"] += 1
        frac = min(step / warmup, 1.0)
        return (1 - frac) * group["momentum_start"] + frac * group["momentum"]

    def _adamw(self, group: dict[str, Any]) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:  # as torch.optim.AdamW lays out its state
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        adamw(
            params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, beta1=beta1,
            beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
            maximize=False,
        )  # fmt: skip


def muon_groups(model: torch.nn.Module, s: MuonSettings) -> list[dict[str, Any]]:
    """The three groups (module docstring): Muon's are the 2-D parameters of `model.blocks()`."""
    hidden = {id(p) for block in model.blocks() for p in block.parameters() if p.dim() == 2}
    if not hidden:
        raise ValueError(
            "train.optimizer.name: muon orthogonalises the 2-D weights of the model's blocks,"
            " and this model has none (use adamw)"
        )
    params = list(model.parameters())  # a tied weight appears once
    # with embed_lr, the token embedding apart (tied, it is the head too)
    # and the value embeddings with it, as the record's embed_params
    tables = [model.transformer.wte, *getattr(model, "value_embeds", [])]
    embed = {id(t.weight) for t in tables} if s.embed_lr is not None else set()
    others = [p for p in params if id(p) not in hidden | embed and p.dim() >= 2]
    groups = [
        {"kind": "muon", "params": [p for p in params if id(p) in hidden],
         "lr": s.lr, "weight_decay": s.weight_decay},
        {"kind": "adamw", "params": [p for p in params if id(p) in embed],
         "lr": s.embed_lr, "weight_decay": s.adam_weight_decay},
        {"kind": "adamw", "params": others, "lr": s.adam_lr, "weight_decay": s.adam_weight_decay},
        {"kind": "adamw", "params": [p for p in params if p.dim() < 2],
         "lr": s.adam_lr if s.scalar_lr is None else s.scalar_lr, "weight_decay": 0.0},
    ]  # fmt: skip
    return [g for g in groups if g["params"]]


def muon(model: torch.nn.Module, s: MuonSettings) -> Muon:
    """The `muon` optimizer of lmpipe.registry.OPTIMIZERS."""
    return Muon(muon_groups(model, s), s)
