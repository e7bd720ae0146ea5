"""Run one evaluation of a converted model (the `evaluate` rule), or score OpenAI's GPT-2.

    python -m lmpipe.eval NAME --config-json J --model HF_DIR --out FILE [--tokens M]
        [--hellaswag FILE] [--conversations M]
    python -m lmpipe.eval reference --tokens M --hellaswag FILE --out-dir DIR

NAME is an evaluation of lmpipe.registry.EVALUATIONS (val_loss, hellaswag, hellaswag_lm_eval,
suite, suite_lm_eval, samples, sft_loss, chat_samples); J is its params
(`lmpipe.config.eval_params`): the run, the evaluation and its settings. The inputs it reads
besides the model are named by kind, a flag a kind of lmpipe.config.INPUT_FILES.
`reference` scores OpenAI's `gpt2` with val_loss and hellaswag when the Hugging Face hub can be
reached, and otherwise writes nothing and exits 0 (the report uses the published figures); it is
not part of the DAG.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lmpipe.config import INPUT_FILES, EvalJob
from lmpipe.eval.results import default_device, write_result
from lmpipe.hardware import keep_freed_memory
from lmpipe.registry import EVALUATIONS, code

INPUT_KINDS = sorted(INPUT_FILES)
REFERENCE_MODEL = "openai-community/gpt2"


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


def reference(tokens: Path, hellaswag: Path, out_dir: Path) -> None:
    try:
        from huggingface_hub import snapshot_download

        model_dir = snapshot_download(
            REFERENCE_MODEL, allow_patterns=["config.json", "model.safetensors"]
        )
    except Exception as e:  # offline, hub down, proxy: all mean "use the published figures"
        print(f"reference: {REFERENCE_MODEL} unavailable ({type(e).__name__}: {e});")
        print("the report uses the published figures (lmpipe.report.references) instead")
        return
    inputs = {"tokens": tokens, "hellaswag": hellaswag}
    for name in ("val_loss", "hellaswag"):
        settings = EVALUATIONS[name].settings()
        evaluate(name, settings, Path(model_dir), inputs, out_dir / f"{name}.json")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("name", choices=[*EVALUATIONS, "reference"])
    p.add_argument("--config-json", help="the evaluation's params (JSON)")
    p.add_argument("--model", type=Path, help="converted Hugging Face model folder")
    p.add_argument("--out", type=Path, help="result JSON file to write")
    p.add_argument("--out-dir", type=Path, help="reference: folder for its result files")
    for kind in INPUT_KINDS:
        p.add_argument(f"--{kind}", type=Path, help=f"input: {kind}")
    args = p.parse_args(argv)
    inputs = {k: getattr(args, k) for k in INPUT_KINDS if getattr(args, k) is not None}
    if args.name == "reference":
        if not (args.tokens and args.hellaswag and args.out_dir):
            p.error("reference needs --tokens, --hellaswag and --out-dir")
        reference(args.tokens, args.hellaswag, args.out_dir)
        return
    if not (args.config_json and args.model and args.out):
        p.error(f"{args.name} needs --config-json, --model and --out")
    job = EvalJob.from_json(args.config_json)
    if job.evaluation != args.name:
        p.error(f"--config-json is evaluation {job.evaluation!r}'s, not {args.name!r}'s")
    evaluate(args.name, job.settings, args.model, inputs, args.out)


if __name__ == "__main__":
    main()
