"""Architectures, chosen by `model.arch` (lmpipe.registry.ARCHITECTURES); no distributed code.

An architecture is a package (e.g. lmpipe/models/gpt2/) whose `Model(config: ModelConfig)` is an
nn.Module that knows nothing of parallelism and offers what the trainer and evaluators call:

- `forward(idx, targets=None)`: (fp32 logits over the real vocabulary, None) without targets,
  (None, mean loss) with them (targets of -1 do not count);
- `hidden_states(idx, positions=None, mask=None)` and `head(h)`: the trunk and the LM head apart
  (scorers that need the head at a few positions only); positions (B, T) and a boolean
  attention mask (B, 1, T, T) for packed scoring rows (lmpipe.eval.packing), causal by default;
- `blocks()`: the repeated blocks, which FSDP shards (and compile compiles) one by one;
- optionally `embed(idx, positions=None)`, the stem before the blocks, and `head_loss(x,
  targets)`, the tail after them (final norm -> LM head -> loss, from the blocks' output): where
  a model has them, train.compile_scope `regions` compiles each as a region of its own
  (lmpipe.train.parallel; gpt2 and modern have them, hf not);
- `init_weights()`, `num_params()`, `flops_per_token(seq_len)`, `head_flops_per_token()`,
  `loss_fn`, the head + loss the forward trains with (lmpipe.models.head_loss: plain, compiled or
  in chunks, as the trainer sets it), and the `head_on_counted_only` switch (fine-tuning: the
  head runs only where the loss counts).

The package also brings its export adapters: `write_hf(model, tokenizer_dir, out_dir, meta)`,
`load_hf(hf_dir)` and, where the format can hold it, `write_llmc(model, path)`. `write_hf` writes
model/hf/: a transformers folder (GPT-2) or, where no transformers class computes the model's
logits (modern), a native one that ships its model code for transformers' trust_remote_code
(modern/hf.py); its config.json's `lmpipe_arch` tells `load_hf` (build.py) which. A chat run's
folder carries the Vicuna template as its tokenizer's chat_template (lmpipe.data.chat_format).

And its shape, `shape.py`: torch-free, what the architecture is without building it: its
parameters (`num_params`), the FLOPs' N where not all of them (`flops_params`), its attention
FLOPs (`attention_flops`), Muon's matrices (`hidden_matrices`) and its settings dataclass, if its
models have settings beyond the shape (modern's `ModernSettings`, hf's `HFSettings`). The
registry's `Architecture` entry points to them, and the plan, the config check and the Snakefile
read them through it, in a process without torch. So importing these packages imports nothing
heavy: an architecture's package exports `Model` and its adapters lazily (`lazy_exports`, PEP
562's module `__getattr__`: the torch code loads on first use), and so does this one, whose
functions live in build.py (which imports the config and the registry: at the top here, a
circle, since the registry imports the shape modules through this package).

    models/__init__.py          build_model, load_final_checkpoint, load_hf, ...: lazily
    models/build.py             those: a model by its architecture, fresh or read back
    models/<arch>/__init__.py   Model, write_hf, load_hf, (write_llmc): lazily
    models/<arch>/model.py      the nn.Module (torch)
    models/<arch>/hf.py         its model/hf/ folder (hf: export.py)
    models/<arch>/shape.py      its settings and counts, torch-free: the registry's entry

The final checkpoint (`train/final/`, written by lmpipe.train.checkpoint) is read in build.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

META_KEYS = ("run", "model", "train", "settings_hash", "step", "tokens", "world_size")
LMPIPE_META = "lmpipe_meta.json"  # a converted folder's copy of the checkpoint's meta.json


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A package's `__getattr__` (PEP 562): each name of `exports` is imported from its
    "module:attribute" when first asked for, so that importing the package (as the registry
    does, for an architecture's shape.py) imports no torch. tests/test_envs.py reads a package's
    EXPORTS to follow what a job that uses one of its names imports."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = exports[name].split(":")
        return getattr(importlib.import_module(module), attribute)

    return __getattr__


EXPORTS = {
    "architecture": "lmpipe.models.build:architecture",
    "build_model": "lmpipe.models.build:build_model",
    "hf_arch": "lmpipe.models.build:hf_arch",
    "load_final_checkpoint": "lmpipe.models.build:load_final_checkpoint",
    "load_hf": "lmpipe.models.build:load_hf",
    "read_hf_meta": "lmpipe.models.build:read_hf_meta",
    "read_meta": "lmpipe.models.build:read_meta",
}
__getattr__ = lazy_exports(__name__, EXPORTS)
