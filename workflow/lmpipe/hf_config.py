"""A Hugging Face model's shape, without torch in this process.

`model.arch: hf` names a model by `path`: a local folder (its config.json is read) or a hub id,
whose config.json is read from the download stage's folder once it is there, else from a small
copy kept in the repo (`resources/hf_configs/<org>/<name>/config.json`), so the config check,
the plan and the report know the model's shape before anything downloads.

The shape is measured, never computed from a family's formula: `measure` builds the model from
its config.json on PyTorch's meta device and counts it, as torchtitan and accelerate's
`init_empty_weights` build a model to count it (any family transformers can build). That takes
torch and transformers (seconds), so it runs in a subprocess, `python -m lmpipe.hf_config
--measure FOLDER` (in this process where torch is loaded already: a job's), and is kept: beside
a repo copy of a hub model's config (`shape.json`, written by `python -m lmpipe.hf_config
--ship`, held to a fresh measure by tests/test_reference.py), and in the results folder's
`.cache/hf_shapes/` (`cache_shapes_in`, which the Snakefile calls; its jobs inherit the place),
keyed by the config.json's sha256, whether remote code runs, and the transformers version.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

from lmpipe.files import atomic_file
from lmpipe.hf_folder import tokenizer_identity
from lmpipe.paths import REPO_ROOT

HF_CONFIGS = REPO_ROOT / "resources" / "hf_configs"  # config.json copies of hub models
SHIPPED = "shape.json"  # beside a copy: its measured shape
CACHE_VARIABLE = "LMPIPE_HF_SHAPES"  # the cache's folder, for the jobs Snakemake starts
# where measured shapes are kept (cache_shapes_in); empty: nowhere
CACHE: list[Path] = [Path(os.environ[CACHE_VARIABLE])] if os.environ.get(CACHE_VARIABLE) else []


@dataclass(frozen=True)
class HFShape:
    """What the parameter count, the FLOPs and the memory plan need of a decoder-only model,
    measured (`measure`)."""

    model_type: str
    n_layer: int
    n_embd: int  # the residual stream's width (hidden_size)
    n_head: int
    n_kv_head: int  # key/value heads (GQA); n_head without GQA
    head_dim: int
    intermediate: int  # the MLP's inner width
    vocab_size: int
    max_positions: int
    tied: bool  # the LM head is the token embedding
    gated_mlp: bool  # SwiGLU's three matrices (Llama) or GPT-2's two
    num_params: int  # every parameter once, as transformers builds the model
    embedding_params: int  # the token embedding's
    active_params: int  # those a token uses: a mixture of experts' routed experts scaled
    windows: tuple[int | None, ...]  # each layer's sliding window; None: full attention

    @property
    def flops_params(self) -> int:
        """The N of 6N + 6LCT: the parameters a token's matmuls use. An untied token embedding
        is a lookup (left out); tied, it is the head, and counts, as llm.c counts GPT-2's."""
        return self.active_params - (0 if self.tied else self.embedding_params)

    def attention_flops(self, seq_len: int) -> int:
        """The 6LCT of 6N + 6LCT, layer by layer: each layer's queries (heads x head_dim) over
        the keys its window lets them see (seq_len, or the sliding window where smaller)."""
        width = self.n_head * self.head_dim
        return sum(6 * width * min(seq_len, w or seq_len) for w in self.windows)


def shape_of(data: dict) -> HFShape:
    """An HFShape from a measure's JSON (its extra keys, e.g. the transformers version, left)."""
    names = {f.name for f in fields(HFShape)}
    kept = {k: v for k, v in data.items() if k in names}
    return HFShape(**kept | {"windows": tuple(data["windows"])})


def cache_shapes_in(folder: str | Path) -> None:
    """Keep measured shapes in `folder` (the results folder's .cache/hf_shapes), here and in
    the processes started from here."""
    CACHE[:] = [Path(folder)]
    os.environ[CACHE_VARIABLE] = str(Path(folder).resolve())


def config_file(path: str) -> Path:
    """The config.json of model `path`: a local folder's, else the repo's copy of a hub id's."""
    local = Path(path) / "config.json"
    if local.is_file():
        return local
    copy = HF_CONFIGS / path / "config.json"
    if copy.is_file():
        return copy
    raise FileNotFoundError(
        f"{path}: no config.json (not a local model folder, and no copy of a hub model's at"
        f" {copy.relative_to(REPO_ROOT)})"
    )


# a mixture of experts' counts, under each family's config names: (routed experts, experts a token)
EXPERT_KEYS = (("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
               ("num_experts_per_tok", "moe_top_k", "top_k"))  # fmt: skip


# a gated MLP's gate, under each family's names (Llama's gate_proj, Phi-3's fused gate_up_proj,
# Mixtral's w1/w3): the memory plan's activations a token
GATES = ("gate_proj", "gate_up_proj", "w1", "w3")


def first(config: Any, names: tuple[str, ...]) -> Any:
    """The first of `names` the config sets (not None)."""
    return next((v for n in names if (v := getattr(config, n, None)) is not None), None)


def is_expert(name: str) -> bool:
    """A routed expert's parameter: under a module named `experts` (Mixtral's `experts.3.w1`,
    Qwen2-MoE's and OLMoE's `experts.0.gate_proj`, or one fused tensor `experts.gate_up_proj`),
    never a shared expert (`shared_expert`) or the router (`gate`)."""
    return "experts" in name.split(".")[:-1]


def attention_windows(text: Any, layers: int) -> list[int | None]:
    """Each layer's sliding window (None: full attention): `layer_types` where the config lists
    them (Gemma 2/3's alternating layers), else `sliding_window` on every layer where the config
    uses one (Mistral's; Qwen2's only with use_sliding_window)."""
    window = getattr(text, "sliding_window", None)
    if getattr(text, "use_sliding_window", True) is False:
        window = None
    kinds = getattr(text, "layer_types", None)
    if kinds:
        return [window if k == "sliding_attention" else None for k in kinds]
    return [window] * layers


def measure(folder: Path, trust_remote_code: bool = False) -> dict[str, Any]:
    """The shape of the model in `folder` (its config.json): built on PyTorch's meta device (no
    memory, no weights read) and counted. Every parameter once (a tied head is the embedding);
    the token embedding; for a mixture of experts, the parameters a token uses (the routed
    experts' weights scaled by the experts a token is sent to over the experts there are; a
    shared expert, the router and the rest whole). Imports torch and transformers: call it
    through `measured`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(
        folder, local_files_only=True, trust_remote_code=trust_remote_code
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    params = dict(model.named_parameters())  # a tied weight once
    total = sum(p.numel() for p in params.values())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    experts = sum(p.numel() for n, p in params.items() if is_expert(n))
    text = config.get_text_config()
    routed, per_token = first(text, EXPERT_KEYS[0]), first(text, EXPERT_KEYS[1])
    if experts and not (routed and per_token):
        raise ValueError(
            f"{folder / 'config.json'}: the model has experts, but its config names neither how"
            f" many ({', '.join(EXPERT_KEYS[0])}) nor how many a token uses"
            f" ({', '.join(EXPERT_KEYS[1])})"
        )
    active = total - experts + (experts * per_token // routed if experts else 0)
    C, L, H = text.hidden_size, text.num_hidden_layers, text.num_attention_heads
    return {
        "model_type": config.model_type,
        "n_layer": L,
        "n_embd": C,
        "n_head": H,
        "n_kv_head": getattr(text, "num_key_value_heads", None) or H,
        "head_dim": getattr(text, "head_dim", None) or C // H,
        "intermediate": getattr(text, "intermediate_size", None)
        or getattr(text, "n_inner", None)
        or 4 * C,
        "vocab_size": text.vocab_size,
        "max_positions": getattr(text, "max_position_embeddings", None) or 2048,
        "tied": head is not None and head.weight is embedding,
        "gated_mlp": any(part in GATES for n in params for part in n.split(".")),
        "num_params": total,
        "embedding_params": embedding.numel(),
        "active_params": active,
        "windows": attention_windows(text, L),
        "transformers": __import__("transformers").__version__,
    }


def shape_key(file: Path, trust_remote_code: bool) -> str:
    """What a measured shape depends on: the config.json's bytes, whether the model's own code
    runs, and the transformers that builds it."""
    version = importlib.metadata.version("transformers")
    text = file.read_bytes() + f"|{trust_remote_code}|{version}".encode()
    return hashlib.sha256(text).hexdigest()


@cache
def read_shape(path: str, trust_remote_code: bool = False) -> HFShape:
    """The shape of model `path` (a local folder or a hub id), measured. A model transformers
    cannot build from its config (an unknown family, remote code without trust_remote_code) is
    a ValueError naming the config.json and why."""
    file = config_file(path)
    key = shape_key(file, trust_remote_code)
    shipped = file.parent / SHIPPED
    if shipped.is_file() and (data := json.loads(shipped.read_text())).get("key") == key:
        return shape_of(data)
    return shape_of(kept(key, lambda: measured(file.parent, trust_remote_code) | {"key": key}))


def kept(name: str, compute: Callable[[], dict]) -> dict:
    """`compute()`'s answer, kept in CACHE as `name`.json where CACHE is set: what is measured
    in a subprocess (a shape, a tokenizer check) is measured once a key."""
    file = CACHE[0] / f"{name}.json" if CACHE else None
    if file is not None and file.is_file():
        return json.loads(file.read_text())
    data = compute()
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(file) as tmp:
            tmp.write_text(json.dumps(data, indent=1) + "\n")
    return data


def measured(folder: Path, trust_remote_code: bool) -> dict:
    """`measure`, here where torch is loaded already (a job), else in a subprocess, so that
    the plan's process never imports torch."""
    if "torch" in sys.modules:
        try:
            return measure(folder, trust_remote_code)
        except Exception as e:  # whatever transformers raises: one line naming the file
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(
                f"{folder / 'config.json'}: transformers cannot build it ({why})"
            ) from None
    args = ["--measure", str(folder)] + (["--trust-remote-code"] if trust_remote_code else [])
    proc = run_module("lmpipe.hf_config", args)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if why.startswith("ModuleNotFoundError"):  # torch or transformers
            needs = "measuring a model's shape needs torch and transformers in the environment of"
            why += f"; {needs} {sys.executable}"
        raise ValueError(f"{folder / 'config.json'}: transformers cannot build it ({why})")
    return json.loads(proc.stdout)


def run_module(module: str, args: list[str]) -> subprocess.CompletedProcess:
    """`python -m module args` in a child with lmpipe importable as it is here (the Snakefile
    puts workflow/ on sys.path), its output captured."""
    paths = [str(REPO_ROOT / "workflow"), os.environ.get("PYTHONPATH", "")]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    argv = [sys.executable, "-m", module, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env)


TOKENIZER_PROBLEMS: dict[str, str | None] = {}  # check_tokenizer's answers in this process


def check_tokenizer(folder: Path, template: bool) -> None:
    """The folder's tokenizer loaded as the jobs load it (lmpipe.chat.tokenizer_check: an eos,
    its ids within the embedding, the template where `template`), in a subprocess, the answer
    kept (CACHE) under the tokenizer files' and config.json's sha256. A ValueError naming the
    folder and the problem."""
    version = importlib.metadata.version("transformers")
    text = f"{tokenizer_identity(folder)}|{template}|{version}|".encode()
    key = hashlib.sha256(text + (folder / "config.json").read_bytes()).hexdigest()

    def run_check() -> dict:
        args = [str(folder)] + (["--template"] if template else [])
        proc = run_module("lmpipe.chat.tokenizer_check", args)
        lines = proc.stderr.strip().splitlines() or ["no output"]
        return {"problem": None if proc.returncode == 0 else lines[-1]}

    if key not in TOKENIZER_PROBLEMS:  # (asked again here: the config is checked in steps)
        TOKENIZER_PROBLEMS[key] = kept(f"tokenizer-{key}", run_check)["problem"]
    problem = TOKENIZER_PROBLEMS[key]
    if problem is not None:
        raise ValueError(problem)


def ship(path: str) -> Path:
    """Measure a hub model's repo copy of its config.json and write its shape.json beside it."""
    file = config_file(path)
    data = measured(file.parent, False) | {"key": shape_key(file, False)}
    out = file.parent / SHIPPED
    out.write_text(json.dumps(data, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a Hugging Face model's measured shape")
    parser.add_argument("path", nargs="*", help="folders or hub ids (default: every repo copy)")
    parser.add_argument("--ship", action="store_true", help="write shape.json beside repo copies")
    parser.add_argument("--measure", action="store_true", help="measure FOLDER, print its JSON")
    parser.add_argument("--trust-remote-code", action="store_true")
    args = parser.parse_args(argv)
    if args.measure:
        try:
            print(json.dumps(measure(Path(args.path[0]), args.trust_remote_code)))
        except Exception as e:  # one line for the config check to show
            print(f"{type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
            return 1
        return 0
    copies = [str(p.parent.relative_to(HF_CONFIGS)) for p in HF_CONFIGS.glob("*/*/config.json")]
    for path in args.path or copies:
        print(ship(path) if args.ship else f"{path}: {read_shape(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
