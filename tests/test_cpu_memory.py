"""lmpipe.hardware.keep_freed_memory: a CPU job's large tensors reuse freed memory instead of
faulting fresh pages in at every step (the logits of a tiny model are ~200 MB a micro-batch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, resource, sys
import torch
import torch.nn.functional as F
from lmpipe.hardware import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
torch.manual_seed(0)
head = torch.randn(50304, 64, requires_grad=True)  # the tiny model's head
faults = []
for _ in range(20):  # a training step's head and loss: fp32 logits of 512 tokens, 103 MB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.randn(512, 64, requires_grad=True)
    F.cross_entropy(x @ head.T, torch.randint(0, 50257, (512,))).backward()
    head.grad = None
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
"""


def page_faults(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_training_steps_logits_reuse_freed_memory_without_page_faults():
    pages = 512 * 50304 * 4 // 4096  # the logits' ~25K pages of 4 KiB
    default = page_faults("default")["faults"]
    # glibc: fresh pages for each large tensor, ~4 logits' worth a step (logits, softmax, grads)
    assert sum(default[-10:]) > 30 * pages, default
    kept = page_faults("keep")
    assert kept["kept"] is True
    # the first steps grow the heap; from then on the steps reuse it (measured: 0 faults in most
    # steps, a logits' worth now and then: 1-3 logits' worth over 10 steps against ~40)
    assert sum(kept["faults"][-10:]) * 5 < sum(default[-10:]), (kept, default)
