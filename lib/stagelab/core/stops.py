"""Stop signals as a KeyboardInterrupt that cannot be lost.

``stagelab measure`` and ``stagelab run`` stop on Ctrl-C, SIGTERM and SIGHUP alike: the handler
raises KeyboardInterrupt in the main thread, wherever it is. Where that is inside a finalizer
(a ``__del__``, such as the native vector's at the end of every step, or a weakref callback),
Python prints the exception and goes on, and the stop would be lost: a measurement that was told
to stop ended ``ok``. So each signal is also remembered, and :func:`raise_if_received` raises it
again at the next safe point (between timing rounds, before a cell, while a notebook runs and
before the next). Standard library only.
"""

from __future__ import annotations

import contextlib
import signal
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
