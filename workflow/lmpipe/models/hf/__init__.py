"""Any Hugging Face causal LM (`model.arch: hf`): the model and its export (save_pretrained),
each imported on first use (torch, transformers), and its torch-free shape and settings
(shape.py: the measured counts), which the registry reads."""

from lmpipe.models import lazy_exports

EXPORTS = {
    "Model": "lmpipe.models.hf.model:HFCausalLM",
    "load_hf": "lmpipe.models.hf.export:load_hf",
    "write_hf": "lmpipe.models.hf.export:write_hf",
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = sorted(EXPORTS)
