"""Known warnings that libraries log while they are imported and that tell an lmpipe user
nothing, each dropped at the logger that logs it, by its message; every other record of those
loggers, and every other warning, passes.

- torchao (a dependency for `train.fp8` only): transformers imports it at the first model load
  whenever it is installed (its quantizers' module, `transformers.quantizers.quantizer_torchao`),
  so `lmpipe-chat`, convert and the evaluations import it too. Its import loads the CUDA kernels
  it ships (`torchao/_C*.so`) and logs a warning for each that cannot load: on a CPU build of
  torch, every one. `train.fp8` itself needs none of them (torch's own float8 GEMM), and its
  device check (lmpipe.train.fp8) says what is missing in one line.
- torch's pytree: torchao's import registers its Enum classes as pytree constants, and torch
  logs, once a class, that this is deprecated.

`drop()` runs when the lmpipe package is imported, so before any of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

Test = Callable[[logging.LogRecord], bool]


def torchao_kernel_load(record: logging.LogRecord) -> bool:
    """torchao's "Failed to load .../torchao/_C....so: ..." at its import."""
    message = record.getMessage()
    return message.startswith("Failed to load ") and "torchao/_C" in message


def torchao_enum_constant(record: logging.LogRecord) -> bool:
    """torch's "<enum ...> is an Enum subclass and is now natively supported ..." for an Enum
    that torchao registers."""
    args = record.args if isinstance(record.args, tuple) else ()
    return "is an Enum subclass" in str(record.msg) and any(
        getattr(a, "__module__", "").startswith("torchao") for a in args
    )


KNOWN: dict[str, Test] = {
    "torchao": torchao_kernel_load,
    "torch.utils._pytree": torchao_enum_constant,
}


class Drop(logging.Filter):
    """Drops the records a test picks."""

    def __init__(self, test: Test):
        super().__init__()
        self.test = test

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.test(record)


def drop() -> None:
    """The known warnings dropped at their loggers (once a process)."""
    for name, test in KNOWN.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, Drop) and f.test is test for f in logger.filters):
            logger.addFilter(Drop(test))
