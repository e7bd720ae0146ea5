"""GPT-2 (`model.arch: gpt2`): the model and its Hugging Face and llm.c adapters."""

from lmpipe.models.gpt2.hf import load_hf, write_hf
from lmpipe.models.gpt2.llmc import read_llmc, write_llmc
from lmpipe.models.gpt2.model import GPT as Model

__all__ = ["Model", "load_hf", "read_llmc", "write_hf", "write_llmc"]
