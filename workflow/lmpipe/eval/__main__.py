"""Run one evaluation of a model folder (the `evaluate` rule).

    python -m lmpipe.eval NAME --config-json J --model HF_DIR --out FILE [--tokens M]
        [--hellaswag FILE] [--conversations M]

NAME is an evaluation of lmpipe.registry.EVALUATIONS (val_loss, hellaswag, hellaswag_lm_eval,
suite, suite_lm_eval, samples, sft_loss, chat_samples); J is its params
(`lmpipe.config.eval_params`): the run, the evaluation and its settings. The inputs it reads
besides the model are named by kind, a flag a kind of lmpipe.config.INPUT_FILES. A Hugging Face
model (OpenAI's GPT-2, any base) is evaluated as a reference run of the DAG (`train: null`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lmpipe.config import INPUT_FILES, EvalJob
from lmpipe.eval.results import default_device, write_result
from lmpipe.hardware import keep_freed_memory
from lmpipe.job_params import PREFIX
from lmpipe.registry import EVALUATIONS, code

INPUT_KINDS = sorted(INPUT_FILES)


def evaluate(name: str, settings, model_dir: Path, inputs: dict[str, Path], out: Path) -> None:
    """Run evaluation `name` and write its result file."""
    entry = EVALUATIONS[name]
    missing = [kind for kind in entry.inputs if kind not in inputs]
    if missing:
        raise ValueError(f"evaluation {name} needs --{' --'.join(missing)}")
    torch.manual_seed(0)  # nothing here is random but sampling, which seeds its own generator
    device = default_device()
    if device == "cpu":
        keep_freed_memory()
    result = code(entry.run)(settings, Path(model_dir), inputs, device)
    write_result(out, result)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        fromfile_prefix_chars=PREFIX,  # --config-json @FILE (lmpipe.job_params)
    )
    p.add_argument("name", choices=list(EVALUATIONS))
    p.add_argument("--config-json", help="the evaluation's params (JSON, or @FILE holding it)")
    p.add_argument("--model", type=Path, help="converted Hugging Face model folder")
    p.add_argument("--out", type=Path, help="result JSON file to write")
    for kind in INPUT_KINDS:
        p.add_argument(f"--{kind}", type=Path, help=f"input: {kind}")
    args = p.parse_args(argv)
    inputs = {k: getattr(args, k) for k in INPUT_KINDS if getattr(args, k) is not None}
    if not (args.config_json and args.model and args.out):
        p.error(f"{args.name} needs --config-json, --model and --out")
    job = EvalJob.from_json(args.config_json)
    if job.evaluation != args.name:
        p.error(f"--config-json is evaluation {job.evaluation!r}'s, not {args.name!r}'s")
    evaluate(args.name, job.settings, args.model, inputs, args.out)


if __name__ == "__main__":
    main()
