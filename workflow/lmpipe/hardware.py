"""What the pipeline knows about accelerators: dense bf16 peaks (for MFU and for planning).

MFU is llm.c's: achieved model FLOPs (6N + 6LCT a token) over the device's peak. The peak is the
dense (not 2:4 sparse) bf16 tensor-core figure of the vendor's datasheet. The trainer looks the
GPU it finds up here (`launch.peak_flops` only overrides it); the plan uses `launch.gpu_model`.
"""

from __future__ import annotations

# (name as torch.cuda.get_device_name / SLURM GRES types spell it, lower case) -> FLOP/s
GPU_BF16_PEAK: dict[str, float] = {
    "h200": 989e12,  # H200 SXM: the H100 SXM's compute, more memory
    "h100 pcie": 756e12,
    "h100 nvl": 835e12,
    "h100": 989e12,  # H100 SXM
    "a100": 312e12,  # A100 SXM and PCIe
    "l40s": 362e12,
    "a10g": 70e12,  # A10G (AWS): half of the A10's tensor throughput
    "a10": 125e12,
    "l4": 121e12,
    "v100": 125e12,  # fp16 tensor cores (no bf16); what mixed precision gets
}
CPU_NOMINAL_PEAK = 1e12  # no datasheet for "a CPU": MFU of CPU runs is nominal

# the same names -> GB of memory a GPU (datasheets), what the plan checks a job's estimate against
GPU_MEMORY_GB: dict[str, float] = {
    "h200": 141,
    "h100 pcie": 80,
    "h100 nvl": 94,
    "h100": 80,
    "a100": 80,  # the 80GB cards; the 40GB ones below
    "a100-sxm4-40gb": 40,
    "a100-pcie-40gb": 40,
    "l40s": 48,
    "a10g": 24,
    "a10": 24,
    "l4": 24,
    "v100": 32,  # the 32GB card; 16GB ones exist
}


def by_gpu(table: dict[str, float], name: str) -> float | None:
    """`table`'s entry for a GPU by name (e.g. "NVIDIA H200", "a100"), or None if it has none.

    The most specific entry wins: "NVIDIA H100 PCIe" is the PCIe card, "NVIDIA H100 80GB HBM3"
    the SXM one."""
    lowered = name.lower()
    for key in sorted(table, key=len, reverse=True):
        if key.lower() in lowered:
            return table[key]
    return None


def gpu_peak_flops(name: str) -> float | None:
    """The dense bf16 peak of a GPU by name, or None if unknown."""
    return by_gpu(GPU_BF16_PEAK, name)


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory a CPU step frees, for the next step to reuse.

    A CPU step allocates and frees tensors of tens to hundreds of MB (the logits: tokens x 50,304
    fp32). glibc serves each allocation over its mmap threshold (at most 32 MB) with a fresh
    mmap and unmaps it on free, so every step faults its logits' pages in again: a third of the
    demo's CPU time went to the kernel. With mmap off (M_MMAP_MAX 0) and no trimming, they come
    from the heap, already mapped (the allocator point of PyTorch's performance tuning guide,
    which swaps in jemalloc or tcmalloc; this needs no library installed). Measured on the demo
    (2 cores): embedded-a's median step 2.6 s -> 1.9 s, the kernel's share of CPU time 30% -> 10%.
    The price is memory: the heap keeps its peak and fragments (the demo's 2-rank training
    2.5 -> 4.1 GB resident), so CPU jobs only. False where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # macOS, musl: no mallopt
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
