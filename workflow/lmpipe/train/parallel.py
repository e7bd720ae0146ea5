"""Distributed set-up and FSDP2 sharding of a model. The model itself knows nothing of this.

As torchtitan does: `fully_shard` each of the model's `blocks()` (its parameters are gathered
just before its forward and freed after), then the root, which holds the embeddings, the final
norm and the LM head. A tied embedding/head weight is one parameter of the root unit, so it is
never split across two units. With `train.embedding_dtype: bfloat16` the embedding tables are
stored in bf16 and sharded as a unit of their own (an FSDP unit holds one dtype).
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)

from lmpipe.config import FSDPConfig


@dataclass(frozen=True)
class Dist:
    """Where this process sits: its rank and the world size within the data-parallel group, its
    local rank and device, and the mesh the model is sharded over. The mesh is 1-D today (one
    dimension, "dp", over every rank); a second dimension (tensor or context parallelism) would
    be another name of it, and whatever shards data or sums over the data-parallel ranks takes
    `group`, never the world."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def group(self) -> dist.ProcessGroup:
        """The data-parallel process group: loaders' shares, summed metrics, FSDP's sharding."""
        return self.mesh.get_group("dp")


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: get `sig` when the parent dies, so no process outlives the one that started it.

    torchrun starts its workers in new sessions: if the agent is killed (SIGKILL, OOM), orphaned
    workers would otherwise go on training and writing checkpoints beside a restarted run.
    """
    if sys.platform != "linux":
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the call
        os.kill(os.getpid(), sig)


def init_distributed(device_type: str) -> Dist:
    """A process group under torchrun (env vars), or a one-process group without it.

    NCCL on GPUs, gloo on the CPU. Without torchrun the group has one rank (an in-memory
    store), so single-process runs take the same FSDP code path as multi-rank ones.
    """
    if device_type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("launch.device is 'cuda' but no CUDA device is visible")
    backend = "nccl" if device_type == "cuda" else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group(backend, device_id=device if device_type == "cuda" else None)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    mesh = dp_mesh(device.type)
    group = mesh.get_group("dp")
    return Dist(dist.get_rank(group), dist.get_world_size(group), local_rank, device, mesh)


def dp_mesh(device_type: str) -> DeviceMesh:
    """The 1-D data-parallel mesh ("dp") over every rank of the process group."""
    return init_device_mesh(device_type, (dist.get_world_size(),), mesh_dim_names=("dp",))


def mixed_precision(dtype: str, reduce_dtype: str) -> MixedPrecisionPolicy:
    """FSDP2's policy for train.dtype: `bfloat16` gathers bf16 parameters (so the forward and
    backward compute in bf16) and reduce-scatters the gradients in `reduce_dtype`, into the fp32
    sharded parameters the optimizer steps; `float32` casts nothing. The same on every device:
    the CPU runs bf16 too (slower there, but the GPU's numerics are tested before a GPU)."""
    if dtype == "bfloat16":
        return MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=getattr(torch, reduce_dtype)
        )
    return MixedPrecisionPolicy()  # everything in the parameters' dtype (fp32)


# what selective recompute keeps of a block's forward (torchtitan's op-level selective AC keeps
# these too): the matmuls' and attention's outputs, the costly ops; the rest (norms, GELU,
# residual adds, reshapes) is recomputed in the backward
SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def recompute_blocks(blocks: list[torch.nn.Module], mode: str) -> None:
    """Activation checkpointing (train.activation_checkpointing) of each block: its forward runs
    under torch.utils.checkpoint (non-reentrant), which keeps its inputs and, `selective`, the
    SAVED_OPS outputs, and recomputes the rest in the backward. The block's `forward` is wrapped
    in place, not the module, so parameter names (and checkpoints) stay as they are."""
    if mode == "none":
        return
    if mode not in ("full", "selective"):
        raise ValueError(f"activation_checkpointing {mode!r}: expected none, full or selective")
    for block in blocks:
        forward = block.forward

        def recomputed(*args, _forward=forward, **kwargs):
            context = (
                partial(create_selective_checkpoint_contexts, _keep_matmuls)
                if mode == "selective"
                else noop_context_fn
            )
            return checkpoint(_forward, *args, use_reentrant=False, context_fn=context, **kwargs)

        recomputed.recompute = mode  # what provenance.json reads back
        block.forward = recomputed


# a model's stem and tail (lmpipe.models: `embed`, and `head_loss`, the final norm -> LM head ->
# loss), compiled as regions of their own where the architecture has them (gpt2, modern; the hf
# architecture's forward is the transformers model's, and only its blocks and loss compile)
REGIONS = ("embed", "head_loss")


def loss_compiled_alone(model: torch.nn.Module, compile: bool, scope: str, chunk: int) -> bool:
    """Whether the loss (lmpipe.models.head_loss.loss_function) is compiled on its own: under
    compile, unless a compiled graph that calls it traces it (the tail region, the whole model);
    the chunked loss always (its step alone: the loop over chunks is never traced)."""
    if not compile:
        return False
    if chunk > 0:
        return True
    if scope == "model":
        return False
    return not (scope == "regions" and hasattr(model, "head_loss"))


def parallelize(
    model: torch.nn.Module,
    device: torch.device,
    dtype: str,
    compile: bool,
    fsdp: FSDPConfig | None = None,
    mesh: DeviceMesh | None = None,
    activation_checkpointing: str = "none",
    compile_scope: str = "regions",
    compile_mode: str = "default",
    embedding_dtype: str = "float32",
) -> torch.nn.Module:
    """Recompute (activation checkpointing, optional) and compile (optional) each block, then
    shard blocks and root over the data-parallel mesh (`Dist.mesh`; None: a 1-D one over every
    rank, as init_distributed makes), in torchtitan's order (pytorch/torchtitan,
    torchtitan/models/llama3/infra/parallelize.py: apply_ac, then apply_compile, a
    `torch.compile` per TransformerBlock "after AC wrapping and before FSDP", then apply_fsdp);
    then the rest of what `compile_scope` compiles (compile_after_sharding).

    `Module.compile()` and compiled bound methods keep parameter names unprefixed (no
    `_orig_mod.`), so state dicts and checkpoints read the same with or without compile. With
    `prefetch_blocks` k, each block starts the all-gather of the k blocks after it in forward
    (before it in backward), so the communication overlaps the current block's compute. The
    model's `compiled` attribute names what was compiled (provenance.json reads it).
    `embedding_dtype` bfloat16: the tables stored in bf16 (keep_embeddings_in_bf16), one FSDP
    unit of their own, gathered by their own hooks when the stem looks them up.
    """
    fsdp = fsdp or FSDPConfig()
    mesh = mesh if mesh is not None else dp_mesh(device.type)
    if not fsdp.sharded(mesh.size()):
        return unsharded(
            model, device, dtype, compile, activation_checkpointing, compile_scope, compile_mode,
            embedding_dtype,
        )  # fmt: skip
    mp = mixed_precision(dtype, fsdp.reduce_dtype)
    whole = compile and compile_scope == "model"  # one FSDP unit: the root (below)
    blocks = [] if whole else model.blocks()
    prepare_blocks(model, compile, activation_checkpointing, compile_scope, compile_mode)
    for block in blocks:
        fully_shard(
            block, mesh=mesh, mp_policy=mp, reshard_after_forward=fsdp.reshard_after_forward
        )
    if embedding_dtype == "bfloat16":
        fully_shard(
            keep_embeddings_in_bf16(model), mesh=mesh, mp_policy=mp,
            reshard_after_forward=fsdp.reshard_after_forward,
        )  # fmt: skip
    fully_shard(model, mesh=mesh, mp_policy=mp)  # moves the parameters to `device`
    model.compiled = compile_after_sharding(model, compile, compile_scope, compile_mode)
    k = fsdp.prefetch_blocks
    if k > 0:
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + k])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - k) : i][::-1])
    return model


def prepare_blocks(
    model: torch.nn.Module,
    compile: bool,
    activation_checkpointing: str,
    compile_scope: str,
    compile_mode: str,
) -> None:
    """Each block recomputed as train.activation_checkpointing says and, unless the whole model
    is one graph (compile_scope model), compiled on its own with static shapes
    (compile_after_sharding): before any sharding, with FSDP2 or without."""
    recompute_blocks(model.blocks(), activation_checkpointing)
    if compile and compile_scope != "model":
        for block in model.blocks():
            block.compile(mode=compile_mode, dynamic=False)


# what a model's callers call (the trainer's forward; the evaluators' trunk and head apart)
ENTRY_POINTS = ("forward", "hidden_states", "head")


def unsharded(
    model: torch.nn.Module,
    device: torch.device,
    dtype: str,
    compile: bool,
    activation_checkpointing: str = "none",
    compile_scope: str = "regions",
    compile_mode: str = "default",
    embedding_dtype: str = "float32",
) -> torch.nn.Module:
    """One rank's model without FSDP2 (fsdp.shard never, or auto on one rank): on one rank its
    all-gathers and reduce-scatters are copies and its hooks run twice a block a micro-step, for
    nothing. Recomputed and compiled as `parallelize` does, the same regions.

    bf16 by autocast, not by casting the weights as FSDP2's policy does: without FSDP2 nothing
    keeps fp32 master weights beside bf16 copies, and autocast is PyTorch's own way to compute
    in bf16 from fp32 weights (the matmuls and attention in bf16; norms, softmax and the loss in
    fp32). So its numerics are near, not equal, to the FSDP2 run's (bf16 weights everywhere);
    in fp32 the two are the same computation."""
    prepare_blocks(model, compile, activation_checkpointing, compile_scope, compile_mode)
    model.to(device)
    if embedding_dtype == "bfloat16":
        keep_embeddings_in_bf16(model)
    if dtype == "bfloat16":
        for name in ENTRY_POINTS:
            if hasattr(model, name):
                setattr(model, name, autocast(getattr(model, name), device))
    model.compiled = compile_after_sharding(model, compile, compile_scope, compile_mode)
    return model


def keep_embeddings_in_bf16(model: torch.nn.Module) -> list[torch.nn.Module]:
    """train.embedding_dtype bfloat16: every `nn.Embedding` of the model (token, position and
    value embeddings) stored in bf16, as modded-nanogpt's records do (`bf16_embeds = True`:
    `for m in model.modules(): if isinstance(m, nn.Embedding): m.bfloat16()`,
    records/track_1_short/2025-01-04_SoftCap/31d6c427-...txt). Their gradients and the
    optimizer's moments (zeros_like the parameter) are bf16 then too, and each update is rounded
    to bf16: half the bytes of fp32 masters, and the record's numerics. The tables, returned.

    A table whose weight is another module's too (a head tied to the token embedding) is
    refused: the head's matmul would be stored in bf16, and under FSDP2 the tables' unit would
    hold a weight the root's head needs gathered."""
    owners: dict[int, list[str]] = {}  # a parameter's names: two or more where it is tied
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    tables = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    if not tables:
        raise ValueError("train.embedding_dtype bfloat16: the model has no nn.Embedding")
    for table in tables:
        names = owners[id(table.weight)]
        if len(names) > 1:
            raise ValueError(
                f"train.embedding_dtype bfloat16: {names[0]} is tied to {names[1]}, which is no"
                " embedding table: train a model with an untied head (tie_embeddings: false; a"
                " Hugging Face config's tie_word_embeddings: false), or leave it float32"
            )
    for table in tables:
        table.to(torch.bfloat16)
    return tables


def autocast(method: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """`method` run under bf16 autocast on `device`'s type."""

    @functools.wraps(method)
    def in_bf16(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return method(*args, **kwargs)

    return in_bf16


def compile_after_sharding(
    model: torch.nn.Module, compile: bool, scope: str, mode: str
) -> tuple[str, ...]:
    """What train.compile_scope compiles besides the blocks (compiled before sharding), with
    torch.compile's `mode` (train.compile_mode; CUDA graphs: reduce-overhead); what is compiled:

    - `regions`: each block, and the model's stem (`embed`) and tail (`head_loss`: final norm,
      LM head and loss as one function, where torchtitan compiles its loss alone:
      torchtitan/components/loss.py, build_cross_entropy_loss), each a compiled region of its
      own, so that nothing but the FSDP hooks between them runs eagerly;
    - `blocks`: each block only (the loss compiled alone: training_model);
    - `model`: the whole model as one graph, compiled after sharding as torchtitan's
      apply_compile suggests ("Alternatively one can compile the whole model (after applying
      DP)"). FSDP2's hooks are never traced (torch._dynamo.disable), and a hook between blocks
      in the loop over them would make Dynamo run that loop eagerly, so the model is one FSDP
      unit (parallelize shards the root only): its parameters are gathered whole for the step,
      without the per-block overlap or `prefetch_blocks`.

    The blocks, the stem and the whole model are compiled with static shapes (`dynamic=False`):
    validation runs them at its own batch (a few rows, no grad) before training's first
    micro-batch, and Dynamo's automatic dynamic shapes would then mark the batch size dynamic in
    the training graphs too (symbolic shapes for every step of the run). Static, each shape gets
    its own graph: validation's, and training's as if it had come first. The tail, and the whole
    model under fine-tuning's counted-only head, keep automatic dynamic shapes.
    """
    if not compile:
        return ()
    if scope == "model":
        # static too, but where the head's count of positions changes each step (fine-tuning's
        # head_on_counted_only): a graph a count would recompile each step
        dynamic = None if getattr(model, "head_on_counted_only", False) else False
        model.compile(mode=mode, dynamic=dynamic)
        return ("model",)
    compiled = ["blocks"]
    for name in REGIONS if scope == "regions" else ():
        if hasattr(model, name):
            # static: the stem; the tail's count of positions may vary (the counted-only head)
            dynamic = False if name == "embed" else None
            setattr(model, name, torch.compile(getattr(model, name), mode=mode, dynamic=dynamic))
            compiled.append(name)
    return tuple(compiled)


def sync_gradients(model: torch.nn.Module, sync: bool) -> None:
    """Whether the next backward reduce-scatters the gradients (FSDP2's
    `set_requires_gradient_sync`, FSDP1's `no_sync`): off for all but a step's last micro-step,
    its gradients accumulate unsharded on each rank (in the policy's reduce dtype), and the
    step's one reduction carries their sum. A model that is not an FSDP module has nothing to
    reduce."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)


def local_numel(model: torch.nn.Module) -> int:
    """Parameter elements this rank holds (its shards), for checking that sharding happened."""
    return sum(
        p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters()
    )
