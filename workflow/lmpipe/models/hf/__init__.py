"""Any Hugging Face causal LM (`model.arch: hf`): the model and its export (save_pretrained)."""

from lmpipe.models.hf.export import load_hf, write_hf
from lmpipe.models.hf.model import HFCausalLM as Model

__all__ = ["Model", "load_hf", "write_hf"]
