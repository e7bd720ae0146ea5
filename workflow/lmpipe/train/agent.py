"""torchrun, quiet about workers that stopped on a signal: `python -m lmpipe.train.agent ARGS` runs
`torchrun ARGS` (torch.distributed.run) in this process, as the launcher starts it.

Workers that get a stop signal finish the step, save a checkpoint (rank 0 says so in one line) and
exit with EXIT_STOPPED. torchrun takes that for a failure: it stops the ranks still running
(SIGTERM, a warning each), logs the first failure, and ends with a ChildFailedError traceback and
a "Root Cause" table of every rank, some 30 lines that say nothing the worker has not. Here, when
every failed rank exited with EXIT_STOPPED, or by the SIGTERM torchrun sends the others once one
has, torchrun exits with EXIT_STOPPED and without that report. Any other failure is reported
as torchrun reports it.

The launcher sends this process SIGUSR1 when it stops the workers (SLURM's SIGUSR1 does the same).
From then on torchrun's records of the ranks' exits are held back: dropped if the workers did stop,
else logged after all, before torchrun's own report. torchrun itself neither handles nor
forwards SIGUSR1; the launcher starts it ignored, so that it is never fatal here.
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import main as torchrun

from lmpipe.failures import EXIT_STOPPED

# the logger of torchrun's records of its ranks' exits ("Sending process N closing signal
# SIGTERM", "failed (exitcode: 75) local_rank: 0 ...")
RANK_EXITS = "torch.distributed.elastic.multiprocessing.api"


def stopped(failures: dict[int, ProcessFailure]) -> bool:
    """Whether the failed ranks stopped on a signal, each after the checkpoint: one or more
    exited with EXIT_STOPPED, and any other was ended by torchrun's SIGTERM after them."""
    codes = {f.exitcode for f in failures.values()}
    return EXIT_STOPPED in codes and codes <= {EXIT_STOPPED, -signal.SIGTERM}


class HeldAfterStop(logging.Filter):
    """Holds back a logger's records once the workers are being stopped (SIGUSR1)."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False
        self.held: list[logging.LogRecord] = []

    def on_stop(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def filter(self, record: logging.LogRecord) -> bool:
        if self.stopping:
            self.held.append(record)
        return not self.stopping

    def release(self, logger: logging.Logger) -> None:
        """Log the records held back, after all."""
        logger.removeFilter(self)
        for record in self.held:
            logger.handle(record)
        self.held.clear()


def main(argv: list[str] | None = None) -> int:
    held = HeldAfterStop()
    logger = logging.getLogger(RANK_EXITS)
    logger.addFilter(held)
    signal.signal(signal.SIGUSR1, held.on_stop)
    try:
        torchrun(sys.argv[1:] if argv is None else argv)
    except ChildFailedError as e:
        if stopped(e.failures):
            return EXIT_STOPPED
        held.release(logger)
        raise
    except BaseException:  # torchrun's own signals (SIGTERM from SLURM), its errors
        held.release(logger)
        raise
    held.release(logger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
