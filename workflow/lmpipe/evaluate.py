"""Evaluate a converted model; each evaluation writes one small JSON result.

    python -m lmpipe.evaluate loss      --config-json J --model HF_DIR --tokens-manifest M --out F
    python -m lmpipe.evaluate hellaswag --config-json J --model HF_DIR --items FILE --out F
    python -m lmpipe.evaluate lm-eval   --config-json J --model HF_DIR --items FILE --out F
    python -m lmpipe.evaluate samples   --config-json J --model HF_DIR --out F
    python -m lmpipe.evaluate reference --config-json J --tokens-manifest M --items FILE --out-dir D

`J` is the run's eval slice of the config (`lmpipe.config.eval_params`): `{"run", "eval"}`.
The native evaluations (loss, hellaswag, samples) load the HF folder back into `lmpipe.model.GPT`;
`lm-eval` runs the real harness on the HF folder. `reference` scores OpenAI's `gpt2` the same
way when the Hugging Face hub can be reached, and otherwise writes nothing and exits 0 (the report
then uses DESIGN.md's published figures); it is not part of the default DAG.

A result: {"metric", "value", "tokens" or "items", "produced_by": {"module", "model", "scoring",
"checkpoint" (the run's meta.json: step, tokens, settings hash), code and package versions, ...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm

from lmpipe import hellaswag, provenance
from lmpipe.config import EvalConfig, from_dict
from lmpipe.convert import load_native_from_hf, read_hf_meta
from lmpipe.model import GPT
from lmpipe.paths import REPO_ROOT
from lmpipe.sample import sample_completions
from lmpipe.shards import read_shard
from lmpipe.tokenizer import gpt2_encoding

TOKENIZER_DIR = REPO_ROOT / "resources" / "gpt2"
LM_EVAL_TASK_DIR = Path(__file__).parent / "lm_eval_tasks"
LM_EVAL_TASK = "hellaswag_lmpipe"
REFERENCE_MODEL = "openai-community/gpt2"


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def eval_config(config_json: str) -> tuple[str, EvalConfig]:
    cfg = json.loads(config_json)
    return cfg.get("run", "?"), from_dict(EvalConfig, cfg.get("eval", {}), "eval")


def produced_by(model: str | Path, scoring: str, **extra) -> dict:
    return {
        "module": "lmpipe.evaluate",
        "model": str(model),
        "scoring": scoring,
        "checkpoint": read_hf_meta(model) if Path(model).is_dir() else None,
        **extra,
        **provenance.collect(),
    }


def write_result(path: str | Path, result: dict) -> None:
    """Write atomically (tmp, then rename): a result file is either whole or absent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, path)
    print(f"wrote {path}: {result['metric']} = {result.get('value')}")


# ----------------------------------------------------------------------------------------------
# FineWeb validation loss


def val_shard(manifest_path: str | Path) -> Path:
    manifest = json.loads(Path(manifest_path).read_text())
    val = [s for s in manifest["shards"] if s["split"] == "val"]
    if len(val) != 1:
        raise ValueError(f"{manifest_path}: expected one val shard, found {len(val)}")
    return Path(manifest_path).parent / val[0]["file"]


@torch.no_grad()
def val_loss(
    model: GPT, shard: str | Path, val_tokens: int, batch: int, device: str = "cpu"
) -> tuple[float, int]:
    """Mean next-token loss over the first `val_tokens` of the val shard, as llm.c's val loader:
    non-overlapping sequences of block_size tokens, targets shifted by one.

    Returns (loss, tokens scored)."""
    T = model.config.block_size
    tokens = read_shard(shard)
    n_seq = val_tokens // T
    if n_seq == 0:
        raise ValueError(f"eval.val_tokens {val_tokens} is below one sequence of {T} tokens")
    if n_seq * T + 1 > len(tokens):
        raise ValueError(
            f"{shard}: {len(tokens):,} tokens, fewer than the {n_seq * T + 1:,} that"
            f" eval.val_tokens {val_tokens:,} needs"
        )
    total = 0.0
    for start in tqdm(range(0, n_seq, batch), desc="val loss", unit="batch"):
        b = min(batch, n_seq - start)
        buf = torch.from_numpy(tokens[start * T : (start + b) * T + 1].astype(np.int64))
        x, y = buf[:-1].view(b, T).to(device), buf[1:].view(b, T).to(device)
        _, loss = model(x, y)
        total += loss.item() * b * T  # a host sync a batch: fine for an eval
    return total / (n_seq * T), n_seq * T


def run_loss(cfg: EvalConfig, model_dir: str, manifest: str, out: str) -> None:
    device = default_device()
    model = load_native_from_hf(model_dir).to(device)
    shard = val_shard(manifest)
    loss, tokens = val_loss(model, shard, cfg.val_tokens, cfg.val_batch, device)
    write_result(
        out,
        {
            "metric": "fineweb_val_loss",
            "value": loss,
            "tokens": tokens,
            "produced_by": produced_by(
                model_dir, "mean next-token cross-entropy", shard=str(shard), device=device
            ),
        },
    )


# ----------------------------------------------------------------------------------------------
# HellaSwag, native


def run_hellaswag(
    cfg: EvalConfig, model_dir: str, items_file: str, out: str, mode: str = "llmc"
) -> None:
    device = default_device()
    model = load_native_from_hf(model_dir).to(device)
    items = hellaswag.load_items(items_file, cfg.hellaswag_items)
    if len(items) < cfg.hellaswag_items:
        print(f"note: {items_file} holds {len(items)} items, fewer than {cfg.hellaswag_items}")
    result = hellaswag.score(
        model, items, gpt2_encoding(TOKENIZER_DIR), mode, cfg.hellaswag_batch, device
    )
    write_result(
        out,
        {
            "metric": "hellaswag",
            "value": result.acc_norm,
            "acc": result.acc,
            "acc_norm": result.acc_norm,
            "items": result.items,
            "produced_by": produced_by(model_dir, mode, items_file=str(items_file), device=device),
        },
    )


# ----------------------------------------------------------------------------------------------
# HellaSwag through the lm-eval harness


def write_lm_eval_task(items_file: str | Path, work_dir: str | Path) -> Path:
    """Render the local task (lm_eval_tasks/) into `work_dir` with absolute paths; see its YAML."""
    import lm_eval

    task = yaml.safe_load((LM_EVAL_TASK_DIR / f"{LM_EVAL_TASK}.yaml").read_text())
    upstream = Path(lm_eval.__file__).parent / "tasks" / task["include"]
    if not upstream.is_file():
        raise FileNotFoundError(f"{upstream}: lm-eval's hellaswag task not found")
    task["include"] = str(upstream)
    task["dataset_kwargs"]["data_files"]["validation"] = str(Path(items_file).resolve())
    task["dataset_kwargs"]["cache_dir"] = str(Path(work_dir).resolve() / "datasets_cache")
    task_dir = Path(work_dir) / "tasks"
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / f"{LM_EVAL_TASK}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    shutil.copy(LM_EVAL_TASK_DIR / "utils.py", task_dir / "utils.py")
    return task_dir


def lm_eval_hellaswag(
    model_dir: str | Path,
    items_file: str | Path | None,
    limit: int,
    batch_size: int,
    device: str = "cpu",
    log_samples: bool = False,
) -> dict:
    """Run the real harness (`hf` model) on HellaSwag; returns lm-eval's results dict.

    `items_file` None uses lm-eval's own `hellaswag` task and data (needs the internet);
    otherwise the local task on that file, offline.
    """
    if items_file is not None:  # offline: never reach for the hub
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    import lm_eval
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="lmpipe_lm_eval_") as work:
        if items_file is None:
            task, manager = "hellaswag", TaskManager()
        else:
            task = LM_EVAL_TASK
            manager = TaskManager(include_path=str(write_lm_eval_task(items_file, work)))
        return lm_eval.simple_evaluate(
            model="hf",
            model_args={"pretrained": str(model_dir), "dtype": "float32"},
            tasks=[task],
            task_manager=manager,
            num_fewshot=0,
            limit=limit,
            batch_size=batch_size,
            device=device,
            log_samples=log_samples,
            bootstrap_iters=0,
        )


def run_lm_eval(cfg: EvalConfig, model_dir: str, items_file: str | None, out: str) -> None:
    device = default_device()
    # lm-eval's batch counts requests (one per ending): the same rows a batch as the native scorer.
    results = lm_eval_hellaswag(
        model_dir,
        items_file,
        cfg.hellaswag_items,
        cfg.hellaswag_batch * hellaswag.NUM_ENDINGS,
        device,
    )
    task = "hellaswag" if items_file is None else LM_EVAL_TASK
    metrics = results["results"][task]
    n_items = results["n-samples"][task]["effective"]
    write_result(
        out,
        {
            "metric": "hellaswag",
            "value": metrics["acc_norm,none"],
            "acc": metrics["acc,none"],
            "acc_norm": metrics["acc_norm,none"],
            "items": n_items,
            "produced_by": produced_by(
                model_dir,
                "lm_eval",
                harness="lm-eval simple_evaluate, model hf, task " + task,
                items_file=str(items_file) if items_file else "lm-eval's own hellaswag data",
                device=device,
            ),
        },
    )


# ----------------------------------------------------------------------------------------------
# samples


def run_samples(cfg: EvalConfig, model_dir: str, out: str) -> None:
    device = default_device()
    model = load_native_from_hf(model_dir).to(device)
    samples = sample_completions(
        model,
        gpt2_encoding(TOKENIZER_DIR),
        cfg.sample_tokens,
        cfg.sample_top_k,
        cfg.sample_seed,
        device=device,
    )
    for s in samples:
        print(f"{s['prompt']!r} -> {s['completion']!r}")
    write_result(
        out,
        {
            "metric": "samples",
            "samples": samples,
            "tokens": cfg.sample_tokens,
            "produced_by": produced_by(
                model_dir,
                f"top-k sampling, k={cfg.sample_top_k}, seed={cfg.sample_seed}",
                device=device,
            ),
        },
    )


# ----------------------------------------------------------------------------------------------
# reference: OpenAI's gpt2 through the same evaluations (needs the hub; optional)


def run_reference(cfg: EvalConfig, manifest: str, items_file: str, out_dir: str) -> None:
    try:
        from huggingface_hub import snapshot_download

        model_dir = snapshot_download(
            REFERENCE_MODEL, allow_patterns=["config.json", "model.safetensors"]
        )
    except Exception as e:  # offline, hub down, proxy: all mean "use the published figures"
        print(f"reference: {REFERENCE_MODEL} unavailable ({type(e).__name__}: {e});")
        print("the report uses DESIGN.md's published figures instead")
        return
    out = Path(out_dir)
    run_loss(cfg, model_dir, manifest, str(out / "val_loss.json"))
    run_hellaswag(cfg, model_dir, items_file, str(out / "hellaswag.json"))


# ----------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("loss", "hellaswag", "lm-eval", "samples", "reference"):
        s = sub.add_parser(name)
        s.add_argument("--config-json", required=True, help="the run's eval settings (JSON)")
        if name != "reference":
            s.add_argument("--model", required=True, help="converted Hugging Face model folder")
            s.add_argument("--out", required=True, help="result JSON file to write")
        if name in ("loss", "reference"):
            s.add_argument("--tokens-manifest", required=True, help="tokens manifest.json")
        if name in ("hellaswag", "lm-eval", "reference"):
            s.add_argument("--items", help="HellaSwag jsonl (rowanz format)")
    sub.choices["hellaswag"].add_argument("--scoring", choices=hellaswag.MODES, default="llmc")
    sub.choices["lm-eval"].add_argument(
        "--upstream-data", action="store_true", help="lm-eval's own HellaSwag data (internet)"
    )
    sub.choices["reference"].add_argument("--out-dir", required=True)
    args = p.parse_args()

    _, cfg = eval_config(args.config_json)
    if args.what in ("hellaswag", "reference") and not args.items:
        p.error(f"{args.what} needs --items")
    if args.what == "lm-eval" and not (args.items or args.upstream_data):
        p.error("lm-eval needs --items (or --upstream-data)")
    torch.manual_seed(0)  # nothing here is random but sampling, which seeds its own generator
    if args.what == "loss":
        run_loss(cfg, args.model, args.tokens_manifest, args.out)
    elif args.what == "hellaswag":
        run_hellaswag(cfg, args.model, args.items, args.out, args.scoring)
    elif args.what == "lm-eval":
        run_lm_eval(cfg, args.model, None if args.upstream_data else args.items, args.out)
    elif args.what == "samples":
        run_samples(cfg, args.model, args.out)
    elif args.what == "reference":
        run_reference(cfg, args.tokens_manifest, args.items, args.out_dir)


if __name__ == "__main__":
    main()
