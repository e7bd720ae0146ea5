"""Fine-tuning step time: the LM head on the counted tokens only vs on every position.

On the embedded conversations (resources/dummy_conversation.json, rendered and masked by
lmpipe.chat.data) three quarters of a row's targets are -1 (the system line, the user's turns,
padding). `GPT.head_on_counted_only` runs the 50,257-row head on the other quarter; this measures
what that saves on the embedded chat run's model and step (tiny: 3 layers, 4 heads, 64 wide;
4 conversations of 128 tokens a step), one process, the same AdamW and clipping as the trainer.

    python benchmarks/sft_step.py [--threads 2] [--steps 40] [--repeats 3]

The two settings alternate, `--repeats` times each; a repeat's figure is its median step time
after `--warmup` steps, and the figure printed is the median over repeats. Both start from the
same weights and see the same rows, so their losses are printed side by side as a check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from lmpipe.chat.data import prepare, write  # noqa: E402
from lmpipe.chat.loader import ConversationLoader, load_split  # noqa: E402
from lmpipe.config import ConversationsConfig, ModelConfig, ScheduleConfig, TrainConfig  # noqa: E402
from lmpipe.data.loader import DataShare  # noqa: E402
from lmpipe.data.tokenizer import gpt2_encoding  # noqa: E402
from lmpipe.models.gpt2.model import GPT  # noqa: E402
from lmpipe.registry import AdamWSettings  # noqa: E402
from lmpipe.train.optim import build_optimizer, clip_grad_norm, lr_at  # noqa: E402

MODEL = ModelConfig(n_layer=3, n_head=4, n_embd=64, block_size=128)  # config.yaml's `tiny`


def conversations(folder: Path) -> Path:
    """The embedded conversations as SFT rows (what `prepare_conversations` writes)."""
    cfg = ConversationsConfig(dataset="vicuna-dummy", source="local", seq_len=MODEL.block_size)
    records = json.loads((REPO / "resources" / "dummy_conversation.json").read_text())
    write(prepare(records, cfg, gpt2_encoding(str(REPO / "resources" / "gpt2"))), cfg, folder)
    return folder / "manifest.json"


def run(manifest: Path, counted_only: bool, args) -> tuple[float, list[float]]:
    """(median step seconds after the warm-up, the losses) of `args.steps` training steps."""
    x, y = load_split(manifest, "train")
    tc = TrainConfig(seq_len=x.shape[1], micro_batch=args.rows, batch_tokens=args.rows * x.shape[1],
                     optimizer=AdamWSettings(name="adamw", lr=3e-3, weight_decay=0.0),
                     max_steps=args.steps, schedule=ScheduleConfig(warmup_steps=4))  # fmt: skip
    torch.manual_seed(0)
    model = GPT(MODEL)
    model.head_on_counted_only = counted_only
    optimizer = build_optimizer(model, tc.optimizer)
    peak_lrs = [group["lr"] for group in optimizer.param_groups]
    loader = ConversationLoader(x, y, tc.micro_batch, tc.batch_tokens, DataShare(0, 1), seed=1337)
    times, losses = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        for group, peak in zip(optimizer.param_groups, peak_lrs, strict=True):
            group["lr"] = lr_at(step, peak, tc.schedule, tc.max_steps)
        xb, yb = loader.next_batch()
        _, loss = model(xb, yb)
        loss.backward()
        clip_grad_norm(model, tc.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    return statistics.median(times[args.warmup :]), losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=4, help="conversations a step")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = conversations(Path(tmp))
        _, y = load_split(manifest, "train")
        print(f"{len(y)} training rows; {100 * (y != -1).mean():.1f}% of the targets count")
        results: dict[bool, list[float]] = {False: [], True: []}
        losses: dict[bool, list[float]] = {}
        for _ in range(args.repeats):
            for counted_only in (False, True):
                seconds, losses[counted_only] = run(manifest, counted_only, args)
                results[counted_only].append(seconds)
    full, counted = (statistics.median(results[k]) for k in (False, True))
    print(f"{'LM head on':<22}{'ms/step (median)':>18}{'repeats (ms)':>28}")
    for name, key in (("every position", False), ("counted tokens only", True)):
        each = ", ".join(f"{1000 * s:.1f}" for s in results[key])
        print(f"{name:<22}{1000 * statistics.median(results[key]):>18.1f}{each:>28}")
    print(f"speed-up: {full / counted:.2f}x")
    drift = max(abs(a - b) for a, b in zip(losses[False], losses[True], strict=True))
    print(f"loss after {args.steps} steps: {losses[False][-1]:.6f} vs {losses[True][-1]:.6f}"
          f" (largest difference over the steps {drift:.2e})")  # fmt: skip


if __name__ == "__main__":
    main()
