"""The convert stage: the final sharded checkpoint -> a Hugging Face folder, or llm.c's file.

    python -m lmpipe.models --checkpoint FINAL_DIR --tokenizer resources/gpt2 --hf-out DIR
    python -m lmpipe.models --checkpoint FINAL_DIR --llmc-out FILE     # GPT-2 only

The final checkpoint loads in this one process (no process group); the run's architecture
(`model.arch` in its meta.json) brings the writers. The evaluators load the HF folder back
(`lmpipe.models.load_hf`), so what they score is exactly what was exported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmpipe.files import atomic_dir
from lmpipe.models import architecture, load_final_checkpoint


def convert(
    final_dir: str, tokenizer_dir: str | None, hf_out: str | None, llmc_out: str | None
) -> None:
    model, meta = load_final_checkpoint(final_dir)
    print(
        f"loaded {final_dir}: run {meta['run']}, step {meta['step']}, {model.num_params():,} params"
    )
    arch = architecture(model.config.arch)
    if llmc_out and not hasattr(arch, "write_llmc"):  # before anything is written
        raise ValueError(
            f"{final_dir}: model.arch {model.config.arch!r} has no llm.c export (llm.c's format"
            " holds GPT-2 only); ask for --hf-out alone"
        )
    if hf_out:
        with atomic_dir(hf_out) as tmp:
            arch.write_hf(model, tokenizer_dir, tmp, meta)
        print(f"wrote {hf_out}")
    if llmc_out:
        arch.write_llmc(model, llmc_out)
        print(f"wrote {llmc_out} ({Path(llmc_out).stat().st_size:,} bytes)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--checkpoint", required=True, help="final DCP checkpoint folder (with meta.json)"
    )
    p.add_argument("--tokenizer", help="folder with GPT-2 encoder.json and vocab.bpe (--hf-out)")
    p.add_argument("--hf-out", help="Hugging Face model folder to write")
    p.add_argument("--llmc-out", help="llm.c checkpoint file to write")
    args = p.parse_args(argv)
    if not (args.hf_out or args.llmc_out):
        p.error("give --hf-out, --llmc-out or both")
    if args.hf_out and not args.tokenizer:
        p.error("--hf-out needs --tokenizer")
    convert(args.checkpoint, args.tokenizer, args.hf_out, args.llmc_out)


if __name__ == "__main__":
    main()
