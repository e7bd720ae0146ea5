"""Peak memory of one training micro-step: the LM head + loss plain or in chunks, and activation
checkpointing none, full or selective, on the CPU.

Each setting runs in its own process (one rank, FSDP on a gloo group, the trainer's own
`parallelize` and `loss_function`): it builds the model, takes one forward and backward on
`--tokens` positions of random tokens, and reports the rise of its peak resident memory
(getrusage's ru_maxrss) over what it held before the step: the activations, the logits, the
gradients. Settings alternate, `--repeats` times; the figure printed is the median, with its
ratio to the plain head without recompute.

    python benchmarks/train_memory.py [--preset d12] [--tokens 1024] [--repeats 3]

On a GPU the same settings move torch.cuda.max_memory_allocated alike (benchmarks/gpu_check).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRESETS = {  # GPT-2 shapes (config/config.yaml's models)
    "d12": {"n_layer": 12, "n_head": 12, "n_embd": 768},
    "d6": {"n_layer": 6, "n_head": 6, "n_embd": 384},
}
SETTINGS = [  # (label, loss_chunk_tokens, activation_checkpointing)
    ("plain head, no recompute", 0, "none"),
    ("head in chunks of 256, no recompute", 256, "none"),
    ("plain head, selective recompute", 0, "selective"),
    ("plain head, full recompute", 0, "full"),
    ("head in chunks of 256, full recompute", 256, "full"),
]


def one(preset: str, tokens: int, chunk: int, recompute: str) -> float:
    """This process's peak memory rise over one micro-step, in MB (run in a fresh process)."""
    sys.path.insert(0, str(REPO / "workflow"))
    import torch
    import torch.distributed as dist

    from lmpipe.config import model_config
    from lmpipe.models import build_model
    from lmpipe.models.head_loss import loss_function
    from lmpipe.train.parallel import parallelize

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    shape = PRESETS[preset] | {"arch": "gpt2", "block_size": 1024}
    torch.manual_seed(0)
    model = build_model(model_config(shape, "model"))
    model.loss_fn = loss_function(chunk, compile=False)
    model = parallelize(
        model, torch.device("cpu"), "float32", False, activation_checkpointing=recompute
    )
    idx = torch.randint(0, 50257, (tokens // 1024 or 1, min(tokens, 1024) + 1))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    dist.destroy_process_group()
    return (after - before) / 1024  # ru_maxrss is in KB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="d12", choices=sorted(PRESETS))
    ap.add_argument("--tokens", type=int, default=1024, help="positions a micro-step")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one setting, in this process
    args = ap.parse_args()
    if args.one:
        chunk, recompute = json.loads(args.one)
        print(json.dumps(one(args.preset, args.tokens, chunk, recompute)))
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    rises: dict[str, list[float]] = {label: [] for label, _, _ in SETTINGS}
    for _ in range(args.repeats):
        for label, chunk, recompute in SETTINGS:
            cmd = [sys.executable, __file__, "--preset", args.preset, "--tokens",
                   str(args.tokens), "--one", json.dumps([chunk, recompute])]  # fmt: skip
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            rises[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = statistics.median(rises[SETTINGS[0][0]])
    print(f"GPT-2 {args.preset}, {args.tokens} positions a micro-step, fp32 on the CPU, median"
          f" of {args.repeats}: peak resident memory rise over one forward + backward")  # fmt: skip
    print(f"{'setting':40s} {'MB':>8s} {'ratio':>7s}")
    for label, _, _ in SETTINGS:
        mb = statistics.median(rises[label])
        print(f"{label:40s} {mb:8.0f} {mb / base:7.2f}")


if __name__ == "__main__":
    main()
