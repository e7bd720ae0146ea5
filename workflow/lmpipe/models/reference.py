"""A reference run's model folder: a Hugging Face model as it is, for the evaluations.

    python -m lmpipe.models.reference --source FOLDER --out results/runs/RUN/model/hf

The evaluations read every run's `model/hf/`; a reference run's is the source folder linked file
by file (not copied: a 7B model is 13 GB), so nothing downstream tells it from a converted run's.
Checked before anything is linked, each refusal one line naming the folder: weights in
safetensors (a pickle-only checkpoint is refused: it would run code when loaded), and a GPT-2
folder one that the gpt2 architecture's adapter (`lmpipe.models.gpt2.hf.load_hf`) computes
exactly (OpenAI's GPT-2: tanh GELU, LayerNorm eps 1e-5, tied head, one safetensors file).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from lmpipe.files import atomic_dir

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# what the gpt2 architecture's model computes (lmpipe.models.gpt2.hf.hf_config), key -> the
# value a GPT-2 folder must have (absent: transformers' GPT2Config default, the same)
GPT2_AS_OURS = {
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
}


class ReferenceError(ValueError):
    """A folder that cannot be a reference run's model; the message names it."""


def check_folder(source: Path) -> dict:
    """The folder's config.json, once its weights and (for GPT-2) its settings are checked."""
    config_file = source / "config.json"
    if not config_file.is_file():
        raise ReferenceError(f"{source}: no config.json (not a Hugging Face model folder)")
    files = [p.name for p in source.iterdir() if p.is_file()]
    if not any(f.endswith(".safetensors") for f in files):
        pickles = sorted(f for f in files if f.endswith(PICKLE_SUFFIXES))
        what = f"a pickle-only checkpoint ({', '.join(pickles)})" if pickles else "no weights"
        raise ReferenceError(
            f"{source}: {what}; lmpipe loads weights from *.safetensors only (convert it with"
            " transformers' save_pretrained(safe_serialization=True))"
        )
    config = json.loads(config_file.read_text())
    if config.get("model_type") == "gpt2":
        for key, value in GPT2_AS_OURS.items():
            if config.get(key, value) != value:
                raise ReferenceError(
                    f"{config_file}: {key} is {config[key]!r}; the gpt2 architecture computes"
                    f" GPT-2 with {value!r} only"
                )
        if not (source / "model.safetensors").is_file():
            raise ReferenceError(f"{source}: a GPT-2 folder's weights are one model.safetensors")
    return config


def link_folder(source: Path, out: Path) -> list[str]:
    """`out` as a folder of absolute links to `source`'s files (sub-folders linked whole),
    written atomically."""
    names = sorted(p.name for p in source.iterdir() if not p.name.startswith("."))
    with atomic_dir(out) as tmp:
        for name in names:
            os.symlink((source / name).resolve(), tmp / name)
    return names


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--source", required=True, type=Path, help="the Hugging Face model folder")
    p.add_argument("--out", required=True, type=Path, help="the run's model/hf/ folder")
    args = p.parse_args(argv)
    try:
        config = check_folder(args.source)
    except ReferenceError as e:
        raise SystemExit(f"error: {e}") from None
    names = link_folder(args.source, args.out)
    print(f"{args.out}: {len(names)} files linked from {args.source} ({config.get('model_type')})")


if __name__ == "__main__":
    main()
