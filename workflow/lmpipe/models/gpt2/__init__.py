"""GPT-2 (`model.arch: gpt2`): the model and its Hugging Face and llm.c adapters, each imported
on first use (torch), and its torch-free shape (shape.py), which the registry reads."""

from lmpipe.models import lazy_exports

EXPORTS = {
    "Model": "lmpipe.models.gpt2.model:GPT",
    "load_hf": "lmpipe.models.gpt2.hf:load_hf",
    "write_hf": "lmpipe.models.gpt2.hf:write_hf",
    "read_llmc": "lmpipe.models.gpt2.llmc:read_llmc",
    "write_llmc": "lmpipe.models.gpt2.llmc:write_llmc",
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = sorted(EXPORTS)
