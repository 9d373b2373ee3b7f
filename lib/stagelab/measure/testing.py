"""Test utilities: :class:`SyncCounter`, which counts the host waits a code path would make on CUDA.

On a GPU every ``int(t)``, ``bool(t)``, ``.item()``, ``.tolist()``, ``torch.nonzero`` or
``torch.equal`` of a device tensor makes the host wait for all queued device work, and inside a
measured path that changes what is measured. The counter sees those operations on any device, so a
test on a CPU proves how many waits the same code makes on a GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from stagelab.measure import device

aten = torch.ops.aten

# Operations whose result, or whose output's size, the host must read: on CUDA each one waits.
ALWAYS_WAIT = frozenset({
    aten._local_scalar_dense.default,  # item(), int(t), float(t), bool(t), is_nonzero
    aten.nonzero.default,  # torch.nonzero, argwhere, where(cond)
    aten.equal.default,
    aten.allclose.default,
    aten.masked_select.default,
    aten._unique.default, aten._unique2.default, aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.bincount.default,  # its length is the largest value
})
# Boolean-mask indexing sizes its output (reads) or its targets (writes) with a nonzero.
MASK_INDEXING = frozenset({aten.index.Tensor, aten.index_put.default, aten.index_put_.default})
# A blocking copy from a CUDA device to the host waits for it.
COPIES = frozenset({aten._to_copy.default, aten.copy_.default})


def _has_bool_index(indices: Any) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in indices or ())


def _is_blocking_device_to_host(func: Any, args: tuple, kwargs: dict) -> bool:
    """A copy from CUDA to the host that blocks it: any copy into pageable memory (the driver
    stages it synchronously, ``non_blocking`` or not), or a blocking one into pinned memory."""
    if func is aten.copy_.default:
        destination, source = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return (source.device.type == "cuda" and destination.device.type == "cpu"
                and (not non_blocking or not destination.is_pinned()))
    target = kwargs.get("device")
    return (args[0].device.type == "cuda" and target is not None
            and torch.device(target).type == "cpu" and not kwargs.get("non_blocking", False))


def forces_wait(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this aten call makes the host wait for the device on CUDA."""
    if func in ALWAYS_WAIT:
        return True
    if func is aten.repeat_interleave.Tensor:  # its output size is a sum of the repeats
        return kwargs.get("output_size") is None
    if func in MASK_INDEXING:
        return _has_bool_index(args[1])
    if func in COPIES:
        return _is_blocking_device_to_host(func, args, kwargs)
    return False


class SyncCounter(TorchDispatchMode):
    """Counts, while active, the operations that force a device-to-host wait on CUDA.

    ``hidden`` is their number and ``ops`` their names in order (``tolist`` where a host
    tensor's ``tolist()`` was called: it bypasses the dispatcher on a CPU, and on CUDA its copy
    is counted as such). ``explicit`` counts calls to :func:`stagelab.measure.device.synchronize`, the
    library's deliberate waits (wrapped for the duration; callers must call it through the
    module attribute). Usage: ``with SyncCounter() as counter: ...``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.explicit = 0
        self._restore: list[tuple[Any, str, Any | None]] = []

    @property
    def hidden(self) -> int:
        return len(self.ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if forces_wait(func, args, kwargs):
            self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **kwargs)

    def __enter__(self) -> SyncCounter:
        self._wrap(device, "synchronize", self._count_explicit)
        self._wrap(device, "wait_event", self._count_explicit)
        self._wrap(torch.Tensor, "tolist", self._count_tolist)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for owner, name, original in reversed(self._restore):
                if original is None:
                    delattr(owner, name)  # it was inherited: uncover the base class's again
                else:
                    setattr(owner, name, original)
            self._restore.clear()

    def _wrap(self, owner: Any, name: str, counting: Any) -> None:
        original = getattr(owner, name)
        self._restore.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, functools.wraps(original)(
            lambda *args, **kwargs: counting(original, *args, **kwargs)))

    def _count_explicit(self, original: Any, *args: Any, **kwargs: Any) -> None:
        self.explicit += 1
        return original(*args, **kwargs)

    def _count_tolist(self, original: Any, tensor: torch.Tensor) -> Any:
        if tensor.device.type != "cuda":
            self.ops.append("tolist")
        return original(tensor)
