"""HellaSwag: the native batched scorer against the lm-eval harness, same model, same items.

    python benchmarks/hellaswag_bench.py [--model HF_DIR | --preset small] [--items 200]

Both run in this process, each once to warm up (imports, caches), then `--repeats` timed runs;
the figures are medians. Each timed run is the whole evaluation as its CLI does it:
native = load the HF folder into the native GPT, tokenize, score; lm-eval = `simple_evaluate`
(task set-up, model load, requests, scoring). The same rows go into a forward pass in both
(lm-eval's batch counts endings, so it gets 4x the native batch in items). Prints items/s, the
ratio (goal >= 3x) and the accuracies side by side: native in lm-eval scoring must equal lm-eval.
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
from lmpipe.eval import hellaswag
from lmpipe.eval.harness import LM_EVAL_TASK, lm_eval_hellaswag
from lmpipe.eval.results import default_device
from lmpipe.eval.suite import native
from lmpipe.models import load_hf
from lmpipe.models.gpt2.hf import write_hf
from lmpipe.models.gpt2.model import GPT
from lmpipe.paths import REPO_ROOT, TOKENIZER_DIR

# GPT-2's sizes and the CPU demo's, by their names in config/config.yaml, and a small one
PRESETS: dict[str, ModelConfig] = named_models() | {
    "small": ModelConfig(n_layer=4, n_head=4, n_embd=128, block_size=256),
}


def native_run(model_dir: Path, items_file: Path, n: int, batch: int, mode: str, device: str):
    """(acc, acc_norm) of the native scorer on HellaSwag's task under a scoring option."""
    model = load_hf(model_dir).to(device)
    enc = gpt2_encoding(TOKENIZER_DIR)
    task = hellaswag.task_data(hellaswag.load_items(items_file, n), enc, mode)
    rows = batch * hellaswag.NUM_ENDINGS
    score = native.score_task(model, task, enc, rows, device, show_progress=False)
    return sum(score.acc) / score.items, sum(score.acc_norm) / score.items


def lm_eval_run(model_dir: Path, items_file: Path, n: int, batch: int, device: str):
    out = lm_eval_hellaswag(model_dir, items_file, n, batch * hellaswag.NUM_ENDINGS, device)
    return out["results"][LM_EVAL_TASK]


def timed(fn, repeats: int):
    """Median wall seconds, the wall seconds of each run, median CPU seconds, the last result.

    CPU seconds (this process, all threads) are the steadier figure on a shared machine."""
    fn()  # warm-up
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
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--items-file", default=str(REPO_ROOT / "resources/hellaswag_val_sample.jsonl"))
    p.add_argument("--items", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="items a forward pass (native)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    device = default_device()

    with tempfile.TemporaryDirectory(prefix="hellaswag_bench_") as tmp:
        model_dir = Path(args.model) if args.model else Path(tmp) / "hf"
        if not args.model:
            torch.manual_seed(0)
            write_hf(GPT(PRESETS[args.preset]), TOKENIZER_DIR, model_dir, {"run": "bench"})
        items_file = Path(args.items_file)
        n = len(hellaswag.load_items(items_file, args.items))
        desc = args.model or f"random GPT preset {args.preset!r}"
        print(f"model: {desc}; {n} items of {items_file.name}; batch {args.batch} items;")
        print(f"device {device}, {torch.get_num_threads()} threads; medians of {args.repeats}")

        def run_native_lm(mode="lm_eval"):
            return native_run(model_dir, items_file, n, args.batch, mode, device)

        t_nat, ts_nat, c_nat, nat = timed(run_native_lm, args.repeats)
        t_llmc, ts_llmc, c_llmc, llmc = timed(lambda: run_native_lm("llmc"), args.repeats)
        t_lme, ts_lme, c_lme, lme = timed(
            lambda: lm_eval_run(model_dir, items_file, n, args.batch, device), args.repeats
        )

    rows = [
        ("native, lm-eval scoring", t_nat, ts_nat, c_nat, *nat),
        ("native, llm.c scoring", t_llmc, ts_llmc, c_llmc, *llmc),
        ("lm-eval harness", t_lme, ts_lme, c_lme, lme["acc,none"], lme["acc_norm,none"]),
    ]
    head = ("wall s", "items/s", "cpu s", "acc", "acc_norm")
    print(f"\n{'':24s} " + " ".join(f"{h:>8s}" for h in head) + "  wall s of each run")
    for name, t, ts, c, acc, acc_norm in rows:
        runs = ", ".join(f"{x:.1f}" for x in ts)
        print(f"{name:24s} {t:8.2f} {n / t:8.1f} {c:8.2f} {acc:8.4f} {acc_norm:8.4f}  {runs}")
    print(
        f"\nspeed-up over lm-eval, wall (CPU): native lm-eval scoring {t_lme / t_nat:.2f}x"
        f" ({c_lme / c_nat:.2f}x), native llm.c scoring {t_lme / t_llmc:.2f}x"
        f" ({c_lme / c_llmc:.2f}x); goal >= 3x"
    )
    same = nat == (lme["acc,none"], lme["acc_norm,none"])
    print(f"native lm-eval scoring equals the harness: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
