"""The libraries' known import warnings lmpipe drops (lmpipe.import_noise): only those, at their
own loggers. That `lmpipe-chat` starts with none of them is tests/test_chat_template.py's."""

from __future__ import annotations

import enum
import logging

import lmpipe  # noqa: F401 - its import installs the filters

PYTREE = (
    "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value"
    " type. Calling register_constant() on Enum subclasses is deprecated and will be an error"
    " in a future release."
)


class Preference(enum.Enum):
    A = 1


class TorchaoPreference(enum.Enum):  # as torchao.float8's KernelPreference
    A = 1


TorchaoPreference.__module__ = "torchao.quantization.quantize_.common.kernel_preference"


def test_only_the_known_records_are_dropped(caplog):
    caplog.set_level(logging.DEBUG)
    torchao, pytree = logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")
    so = "/venv/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so"
    torchao.warning(f"Failed to load {so}: Could not load this library: {so}")
    pytree.warning(PYTREE, TorchaoPreference)
    kept = [
        (torchao, "Failed to load the model: out of memory"),  # not its kernels'
        (torchao, "Skipping import of cpp extensions due to incompatible torch version."),
        (logging.getLogger("torchao.kernel.intmm"), f"Failed to load {so}"),  # another logger
        (logging.getLogger("other"), f"Failed to load {so}"),
    ]
    for logger, message in kept:
        logger.warning(message)
    pytree.warning(PYTREE, Preference)  # another library's Enum
    said = [(r.name, r.getMessage()) for r in caplog.records]
    assert said[:-1] == [(logger.name, message) for logger, message in kept]
    assert said[-1][0] == "torch.utils._pytree" and "Preference'>" in said[-1][1]
