"""FP8 training of the blocks' linears (train.fp8) with torchao's float8 (tensorwise dynamic
scaling), as torchtitan's float8 component does (pytorch/torchtitan,
torchtitan/components/quantization/float8.py): `convert_to_float8_training` with a
`Float8LinearConfig`, only linears whose dims are multiples of 16 (the FP8 GEMM's alignment) and
never the LM head; under FSDP2 the weights are all-gathered in float8
(`enable_fsdp_float8_all_gather`) and their scales computed for all layers at once after each
optimizer step (`precompute_float8_dynamic_scale_for_fsdp`).

FP8 GEMMs need a GPU of compute capability 8.9 or newer (Ada, Hopper); on the CPU torchao's
emulation (float8 casts, the GEMM in high precision) runs the same numerics, for tests only and
never under torch.compile (torchtitan refuses the same).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

FP8_CAPABILITY = (8, 9)


def fp8_problem(device: torch.device, compile: bool) -> str | None:
    """Why train.fp8 cannot run on `device` (None: it can); one line, said before training."""
    if importlib.util.find_spec("torchao") is None:
        return "train.fp8 is true, but torchao is not installed (pip install torchao==0.18.0)"
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap < FP8_CAPABILITY:
            return (
                f"train.fp8 is true, but {torch.cuda.get_device_name(device)} (compute capability"
                f" {cap[0]}.{cap[1]}) has no FP8; it needs 8.9 or newer (H100, H200, L40S)"
            )
        return None
    if compile:
        return (
            "train.fp8 on the CPU runs torchao's emulation, which torch.compile cannot;"
            " set compile: false"
        )
    return None


def emulated(device: torch.device) -> bool:
    """Whether FP8 runs in torchao's emulation (any device but a CUDA one)."""
    return device.type != "cuda"


def _wanted(module: torch.nn.Module, fqn: str) -> bool:
    """A block's linear whose both dims are multiples of 16 (torchtitan's module_filter_fn)."""
    if not isinstance(module, torch.nn.Linear):
        return True  # a container: convert_to_float8_training looks inside
    return (
        fqn.split(".")[-1] != "lm_head"
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def convert_blocks(model: torch.nn.Module, device: torch.device, fsdp: bool = True) -> int:
    """Swap the blocks' eligible nn.Linear for torchao's Float8Linear, in place, before FSDP2
    shards the model; the count converted."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig(emulate=emulated(device), enable_fsdp_float8_all_gather=fsdp)
    for block in model.blocks():
        convert_to_float8_training(block, config=config, module_filter_fn=_wanted)
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())


def after_optimizer_step(model: torch.nn.Module) -> None:
    """The float8 weights' scales for the next all-gather, one all-reduce for every layer
    (torchao's precompute_float8_dynamic_scale_for_fsdp, called where torchtitan calls it); a
    plain model (fsdp.shard never) gathers nothing and computes its scales in the forward."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def describe(model: torch.nn.Module, device: torch.device) -> dict[str, Any]:
    """What provenance records of FP8: the linears converted and whether emulated."""
    n = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    return {"fp8_linears": n, "fp8_emulated": emulated(device)}
