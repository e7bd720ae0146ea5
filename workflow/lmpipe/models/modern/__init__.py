"""The modern GPT (`model.arch: modern`): the model and its native folder (no llm.c export),
each imported on first use (torch), and its torch-free shape and settings (shape.py), which the
registry reads."""

from lmpipe.models import lazy_exports

EXPORTS = {
    "Model": "lmpipe.models.modern.model:ModernGPT",
    "load_hf": "lmpipe.models.modern.hf:load_hf",
    "write_hf": "lmpipe.models.modern.hf:write_hf",
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = sorted(EXPORTS)
