"""Read-ahead for the training loaders: batches are made on a background thread, off the loop.

`Prefetcher(loader)` wraps a loader with ShardLoader's interface (`next_batch()`, `state_dict()`,
`load_state_dict()`, `.micro`: lmpipe.data.loader.ShardLoader, lmpipe.chat.loader's
ConversationLoader). A daemon thread calls the wrapped loader's `next_batch()` up to `depth`
micro-batches ahead of the training loop and, with `pin=True` on a CUDA machine, copies each batch
into pinned (page-locked) memory, so that the loop's `x.to(device, non_blocking=True)` is a truly
asynchronous DMA rather than a synchronous copy staged through a driver buffer.

Resuming stays exact: the thread reads ahead, so the wrapped loader's position is not the
trainer's. With each batch the thread records the wrapped loader's `state_dict()` when that batch
ended a step (`loader.micro == 0` after it); the consumer adopts that state when it takes the
batch. So `state_dict()` is the position after the last batch the loop took, as the bare loader's
would be, and a checkpoint resumes the same batches however far the thread had read.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import Any

import torch

from lmpipe.data.loader import Batch, Loader


class _Failed:
    """What the thread queues when the wrapped loader raised: the consumer re-raises it."""

    def __init__(self, error: BaseException):
        self.error = error


def _put(q: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put unless told to stop: a full queue never blocks the thread past a stop."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            pass
    return False


def _produce(loader: Loader, q: queue.Queue, stop: threading.Event, pin_device: int | None):
    """The thread: batches (x, y, state at the step's end or None) in order, until stopped.

    It is given the loader, the queue and the event, not the Prefetcher, so that a dropped
    Prefetcher is collected (and its `__del__` stops the thread)."""
    try:
        if pin_device is not None:
            # CUDA's current device is per thread: without this, pinning would create a context
            # on GPU 0 in every rank's thread (what DataLoader's pin-memory thread also avoids).
            torch.cuda.set_device(pin_device)
        while not stop.is_set():
            x, y = loader.next_batch()
            state = loader.state_dict() if loader.micro == 0 else None
            if pin_device is not None:
                x, y = x.pin_memory(), y.pin_memory()
            if not _put(q, (x, y, state), stop):
                return
    except BaseException as e:  # noqa: B036 - handed to the consumer, which raises it
        _put(q, _Failed(e), stop)


# Prefetchers whose thread may run: stopped and joined at interpreter exit. A daemon thread still
# inside torch when the interpreter finalizes can abort the process (SIGABRT, "terminate called
# without an active exception") and so hide the exit code of the error that ended it.
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for prefetcher in list(_LIVE):
        prefetcher.close()


class Prefetcher:
    """`loader`'s batches, in the same order, made up to `depth` micro-batches ahead on a thread.

    pin: copy each batch into pinned memory, if CUDA is available (pinned memory needs an
        accelerator: on a CPU-only build `Tensor.pin_memory()` raises). `self.pin` says whether
        batches are pinned. Ask for it when the batches go to a GPU.
    The thread starts at the first `next_batch()` (so a `load_state_dict()` right after building
    reads nothing twice), is a daemon (it never keeps the process alive) and stops at `close()`;
    after `close()` only `load_state_dict()` makes batches again (the wrapped loader has read
    ahead: carrying on from it would skip batches). An error of the wrapped loader is raised by
    `next_batch()` at the batch where the bare loader would have raised it, and at every later call.
    """

    def __init__(self, loader: Loader, depth: int = 2, pin: bool = False):
        self._thread: threading.Thread | None = None
        if depth < 1:
            raise ValueError(f"depth {depth}: at least one batch ahead")
        self.loader, self.depth = loader, depth
        self.pin = pin and torch.cuda.is_available()
        self.micro_steps = getattr(loader, "micro_steps", None)
        # the consumer's position: the state after the last step it completed
        self._at_boundary = loader.micro == 0
        self._state = loader.state_dict() if self._at_boundary else None
        self._error: BaseException | None = None
        self._closed = False

    def _start(self) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=self.depth)
        self._stop = threading.Event()
        pin_device = torch.cuda.current_device() if self.pin else None  # the loop's device
        self._thread = threading.Thread(
            target=_produce,
            args=(self.loader, self._queue, self._stop, pin_device),
            name="lmpipe-prefetch",
            daemon=True,
        )
        self._thread.start()
        _LIVE.add(self)

    def next_batch(self) -> Batch:
        """The wrapped loader's next micro-batch (in pinned memory when `self.pin`)."""
        if self._error is not None:
            raise self._error
        if self._thread is None:
            if self._closed:
                raise RuntimeError("Prefetcher closed: load_state_dict() to read again")
            self._start()
        while True:
            try:
                item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:  # the thread always queues a batch or an error, unless stopped
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the prefetch thread has stopped") from None
        if isinstance(item, _Failed):
            self._error = item.error
            raise item.error
        x, y, state = item
        self._at_boundary = state is not None
        if state is not None:
            self._state = state
        return x, y

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch taken (not the thread's); only between steps."""
        assert self._at_boundary, "the loader position is saved between steps only"
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stop the thread, drop what it read ahead, move the wrapped loader; the thread starts
        again at the next `next_batch()`."""
        self._stop_thread()
        self.loader.load_state_dict(state)
        self._state, self._at_boundary = dict(state), True
        self._error, self._closed = None, False

    def close(self) -> None:
        """Stop the thread and wait for it (it finishes the batch it is making)."""
        self._stop_thread()
        self._closed = True

    def _stop_thread(self) -> None:
        # joined without a time limit: the wrapped loader must not move while the thread runs
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def __del__(self) -> None:
        if self._thread is not None:  # no join: this may run at interpreter exit
            self._stop.set()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
