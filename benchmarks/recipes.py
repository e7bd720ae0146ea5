"""Two training recipes on the embedded data, over seeds: GPT-2 + AdamW against the speedrun's.

Each recipe is a run of config/config.yaml (default `embedded-a4`, GPT-2 + AdamW, and
`embedded-speedrun`, modded-nanogpt's record recipe scaled down: the same model size, data,
tokens a step and steps; `--runs embedded-a embedded-modern` for the 3-block modern + Muon
pair), trained for real by the trainer (`python -m lmpipe.train`, torchrun, the run's own ranks)
once a seed, with validation every `--val-every` steps (its other in-training
evaluations off: they cost time and change nothing of the trajectory). Printed side by side:

- the final val loss of each recipe (median, min-max over seeds);
- the tokens each run needs to reach the baseline's final val loss (the median over its seeds),
  read off its val curve by linear interpolation between validations; "-" where it never does;
- the median step time (wall time between train lines), and the ratios to the baseline.

With `--ablate`, the second recipe again with one of its choices undone at a time (each a model
or optimizer setting: the architecture's switches, AdamW instead of Muon), one seed each unless
`--ablate-seeds` says more.

    python benchmarks/recipes.py [--runs embedded-a4 embedded-speedrun] [--seeds 1337 1338 1339]
                                 [--val-every 4] [--ablate] [--out build/recipes]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from lmpipe import config as lmconfig  # noqa: E402
from lmpipe import schema  # noqa: E402
from lmpipe.files import read_json_lines  # noqa: E402

# one choice of the modern recipe undone at a time: (label, model settings, optimizer)
ABLATIONS: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("learned positions (no rope)", {"rope": False}, None),
    ("layernorm (not rmsnorm)", {"norm": "layernorm"}, None),
    ("no qk_norm", {"qk_norm": False}, None),
    ("gelu MLP (not relu2)", {"mlp": "gelu"}, None),
    ("tied head", {"tie_embeddings": True}, None),
    ("no zero init", {"zero_init": False}, None),
    ("no logit soft cap", {"logit_softcap": None}, None),
    ("AdamW (not Muon), lr 3e-3", {}, {"name": "adamw", "lr": 3.0e-3}),
]


def tokens_manifest(config: dict[str, Any], run: str) -> Path:
    """The run's token shards, made by the workflow's own data stages if missing."""
    layout = lmconfig.layout(config)
    manifest = REPO / layout.tokens_manifest(lmconfig.text_dataset(config, run))
    if not manifest.is_file():
        subprocess.run(
            [sys.executable, "-m", "snakemake", "--cores", "2", str(manifest.relative_to(REPO))],
            cwd=REPO, check=True, env=dict(os.environ, PATH=f"{Path(sys.executable).parent}"
                                          f"{os.pathsep}{os.environ.get('PATH', '')}"),
        )  # fmt: skip
    return manifest


def job_of(
    config: dict[str, Any], run: str, seed: int, val_every: int, model: dict | None = None,
    optimizer: dict | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The run's train params (what the train rule hands the trainer), with this seed, val every
    `val_every` steps, no other evaluation during training, no periodic checkpoints."""
    job = json.loads(lmconfig.train_params(config, run))
    train = job["train"]
    train.update(seed=seed, val_every=val_every, checkpoint_every=0)
    job.pop("during_training", None)
    if model:
        job["model"].update(model)
    if optimizer:
        train["optimizer"] = optimizer
    return job


def train(job: dict[str, Any], manifest: Path, out: Path) -> list[dict[str, Any]]:
    """Train for real (the launcher, torchrun, the run's ranks); its metrics.jsonl lines."""
    if not (out / "final").is_dir():
        cmd = [sys.executable, "-m", "lmpipe.train", "--worker", "lmpipe.train.pretrain"]
        cmd += ["--config-json", json.dumps(job), "--data", str(manifest), "--out", str(out)]
        env = dict(os.environ, PYTHONPATH=str(REPO / "workflow"), OMP_NUM_THREADS="1")
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"training {out} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    values, _torn = read_json_lines(out / "metrics.jsonl")
    return [record for _line, record in values]


def tokens_to_reach(lines: list[dict[str, Any]], target: float) -> float | None:
    """The tokens at which the val curve first reaches `target`, linearly between validations."""
    val = [(r["tokens"], r["val_loss"]) for r in lines if "val_loss" in r]
    for (t0, l0), (t1, l1) in zip(val, val[1:], strict=False):
        if l1 <= target:
            return t1 if l0 == l1 else t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return val[0][0] if val and val[0][1] <= target else None


def step_time(lines: list[dict[str, Any]]) -> float:
    """The median wall time between consecutive train lines (the first step's compile and
    start-up excluded; validations in between included)."""
    walls = [r["wall_s"] for r in lines if "loss" in r and "wall_s" in r]
    return statistics.median(b - a for a, b in zip(walls[1:], walls[2:], strict=False))


def spread(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{statistics.median(values):{fmt}} ({lo:{fmt}}-{hi:{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs=2, default=["embedded-a4", "embedded-speedrun"],
                        metavar=("BASELINE", "OTHER"))  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=[1337, 1338, 1339])
    parser.add_argument("--val-every", type=int, default=4)
    parser.add_argument("--ablate", action="store_true", help="also the ablations of OTHER")
    parser.add_argument("--ablate-seeds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "build" / "recipes")
    args = parser.parse_args()
    config = schema.load_config(REPO / "config" / "config.yaml")
    base, other = args.runs
    manifest = tokens_manifest(config, base)

    rows: list[tuple[str, list[list[dict[str, Any]]]]] = []
    for run in (base, other):
        curves = []
        for seed in args.seeds:
            job = job_of(config, run, seed, args.val_every)
            curves.append(train(job, manifest, args.out / run / f"seed{seed}"))
            print(f"{run} seed {seed}: final val loss {final(curves[-1]):.4f}", flush=True)
        rows.append((run, curves))
    if args.ablate:
        for label, model, optimizer in ABLATIONS:
            curves = []
            for seed in args.seeds[: args.ablate_seeds]:
                job = job_of(config, other, seed, args.val_every, model, optimizer)
                name = label.split(" (")[0].replace(" ", "-")
                curves.append(train(job, manifest, args.out / f"{other}-{name}" / f"seed{seed}"))
            rows.append((f"{other}: {label}", curves))

    target = statistics.median(final(c) for c in rows[0][1])
    base_tokens = [tokens_to_reach(c, target) for c in rows[0][1]]
    base_step = statistics.median(step_time(c) for c in rows[0][1])
    print(f"\ntarget: {base}'s final val loss, median of {len(args.seeds)} seeds = {target:.4f}")
    head = ("recipe", "seeds", "final val loss", "tokens to the target", "x baseline", "step s",
            "x baseline")  # fmt: skip
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, curves in rows:
        reach = [t for t in (tokens_to_reach(c, target) for c in curves) if t is not None]
        ratio = [t / statistics.median(b for b in base_tokens if b) for t in reach]
        steps = statistics.median(step_time(c) for c in curves)
        missed = len(curves) - len(reach)
        print(
            f"| {name} | {len(curves)} | {spread([final(c) for c in curves], '.4f')} | "
            f"{spread(reach, ',.0f')}{f' ({missed} never)' if missed else ''} | "
            f"{spread(ratio, '.2f')} | {steps:.3f} | {steps / base_step:.2f} |"
        )


def final(lines: list[dict[str, Any]]) -> float:
    return [r["val_loss"] for r in lines if "val_loss" in r][-1]


if __name__ == "__main__":
    main()
