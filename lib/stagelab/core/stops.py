"""Stop signals as a KeyboardInterrupt that cannot be lost.

``stagelab measure`` and ``stagelab run`` stop on Ctrl-C, SIGTERM and SIGHUP alike: the handler
raises KeyboardInterrupt in the main thread, wherever it is. Where that is inside a finalizer
(a ``__del__``, such as the native vector's at the end of every step, or a weakref callback),
Python prints the exception and goes on, and the stop would be lost: a measurement that was told
to stop ended ``ok``. So each signal is also remembered, and :func:`raise_if_received` raises it
again at the next safe point (between timing rounds, before a cell, while a notebook runs and
before the next). Once a command has returned, its records are closed: :func:`end_quietly` makes
a stop in the interpreter's shutdown end the process at once, not print a traceback from a
finalizer. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterable, Iterator
from typing import Any

# Ctrl-C, a lease's end, a closed terminal: each stops a run as Ctrl-C does.
SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                if hasattr(signal, name))
_received: list[int] = []  # the stop signals received inside the current as_interrupt block


def _raise(signum: int, _frame: Any) -> None:
    _received.append(signum)
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def as_interrupt(signals: Iterable[int]) -> Iterator[None]:
    """Inside the block, each of ``signals`` raises KeyboardInterrupt where it lands and is
    remembered for :func:`raise_if_received`; the previous handlers come back afterwards."""
    _received.clear()
    previous = {signum: signal.signal(signum, _raise) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _received.clear()


def raise_if_received() -> None:
    """Raise KeyboardInterrupt when a stop signal was received, even one a finalizer swallowed."""
    if _received:
        raise KeyboardInterrupt(f"signal {signal.Signals(_received[0]).name}")


def end_quietly(status: int) -> None:
    """From now on, a stop signal flushes the standard streams and ends the process with
    ``status``. For a command's process once its work is done and recorded: the interpreter's
    shutdown runs finalizers (torch's among them), and a second Ctrl-C landing in one printed a
    traceback under a whole record."""
    def end_now(_signum: int, _frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed terminal, a write it interrupted
                stream.flush()
        os._exit(status)

    for signum in SIGNALS:
        signal.signal(signum, end_now)
