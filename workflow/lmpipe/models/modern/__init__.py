"""The modern GPT (`model.arch: modern`): the model and its native folder (no llm.c export)."""

from lmpipe.models.modern.hf import load_hf, write_hf
from lmpipe.models.modern.model import ModernGPT as Model

__all__ = ["Model", "load_hf", "write_hf"]
