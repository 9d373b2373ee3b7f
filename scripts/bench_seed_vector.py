"""The seed vector's timed ``alloc`` stage with and without the harness's bookkeeping.

Times, at one ``n x V`` (default 16 x 152064 fp32, 9.7 MB), medians of many calls each:

* ``bare C``: ``sl_vector_new`` + ``sl_vector_free`` through ctypes, nothing else;
* ``step``: what the step's ``alloc`` stage times, ``native.seed_vector`` (the process's
  malloc learnt once), then the free; the bookkeeping the step adds around it (two
  ``getrusage`` reads and ``mapped``, outside the stage) timed apart;
* ``maps per call``: the same with ``/proc/self/maps`` read and scanned per vector, as every
  vector did before the allocator was learnt once per process.

Run it through the machine's CPU lock where others share the cores; the figures are this
machine's, never a target. ``python scripts/bench_seed_vector.py [rows] [vocab] [calls]``.
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time
from pathlib import Path

from stagelab.measure import native, step_pipelines


def median_ms(call, calls: int) -> float:
    """Median milliseconds of ``calls`` calls (after 5 discarded)."""
    for _ in range(5):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(rows: int = 16, vocab: int = 152064, calls: int = 200) -> None:
    native.require()
    native.process_allocator()
    library, numel = native.library(), rows * vocab

    def bare() -> None:
        data = ctypes.c_void_p()
        library.sl_vector_free(library.sl_vector_new(numel, 0, ctypes.byref(data)), 0)

    def seed() -> None:
        native.seed_vector(numel).free()

    def bookkeeping() -> None:
        before = step_pipelines.minor_faults()
        vector = native.seed_vector(numel)
        _ = step_pipelines.minor_faults() - before, vector.mapped
        vector.free()

    def maps_per_call() -> None:
        native._allocator_in(Path("/proc/self/maps").read_text())
        native.seed_vector(numel).free()

    print(f"seed vector {rows} x {vocab} fp32 ({4 * numel / 1e6:.1f} MB), median of {calls}:")
    for name, call in (("bare C", bare), ("step's alloc stage", seed),
                       ("step with its bookkeeping", bookkeeping),
                       ("maps read per call (before)", maps_per_call)):
        print(f"  {name:30} {median_ms(call, calls):7.3f} ms")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
