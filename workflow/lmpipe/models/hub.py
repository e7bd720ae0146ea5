"""The download stage of a hub model (`arch: hf` named by a hub id): the one time a model
downloads, in a local rule (compute nodes often have no internet).

    python -m lmpipe.models.hub --config-json '{"path": "ORG/NAME", "revision": SHA}' --out DIR

huggingface_hub's `snapshot_download` fetches the weights in safetensors and the config and
tokenizer files only, at the revision the config pins; a repo without safetensors weights (a
pickle-only checkpoint) is refused with one line naming it. `HF_TOKEN` (a gated model, as
Llama 2) is honoured by huggingface_hub itself; this module never prints or stores it.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from lmpipe.files import atomic_dir
from lmpipe.models.reference import ReferenceError, check_folder

# weights in safetensors (with their index), config, generation config, tokenizer files
ALLOW = ["*.safetensors", "*.safetensors.index.json", "*.json", "tokenizer.model", "*.txt",
         "*.tiktoken", "merges.txt", "vocab.json"]  # fmt: skip


def download(path: str, revision: str | None, out: Path) -> list[str]:
    """The model's files into `out` (atomically: an interrupted download leaves nothing)."""
    from huggingface_hub import snapshot_download

    with atomic_dir(out) as tmp:
        snapshot_download(path, revision=revision, allow_patterns=ALLOW, local_dir=tmp)
        shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
        try:
            check_folder(tmp)
        except ReferenceError as e:
            raise ReferenceError(f"hub model {path}@{revision or 'main'}: {e}") from None
        return sorted(p.name for p in tmp.iterdir())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config-json", required=True, help="lmpipe.config.download_model_params")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    cfg = json.loads(args.config_json)
    try:
        names = download(cfg["path"], cfg.get("revision"), args.out)
    except ReferenceError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"{args.out}: {', '.join(names)}")


if __name__ == "__main__":
    main()
