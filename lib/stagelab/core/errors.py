"""The suite's exceptions, in one place, so that every floor can raise and catch them.

``UserError`` is a mistake in what was asked (the CLI prints it in one line and exits 2); the
others say why something could not be measured or read, in words that name the cause.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user asked for: reported in one line, without a traceback."""


class BadRecord(UserError):
    """A record (manifest, verdict, kept label) cannot be read or has the wrong shape; the
    message is one line naming the file."""


class SchemaError(ValueError):
    """A table does not follow the tidy schema."""


class InsufficientMemory(MemoryError):
    """A configuration would not fit; raised before anything large is allocated."""


class PinnedMemoryUnavailable(RuntimeError):
    """Pinned (page-locked) host memory needs a CUDA device, and there is none here."""


class NativeUnavailable(RuntimeError):
    """The seed's native host path (C++) could not be built or loaded here; the reason says why."""


class DeadlineReached(RuntimeError):
    """A sweep stopped at a cell boundary: the next cell would have passed the deadline."""


class ExtraUnavailable(RuntimeError):
    """An optional package (numpy, nvidia-ml-py) is not importable here: what needs it is
    recorded unavailable, with this reason."""


class RowsFileFull(RuntimeError):
    """A rows file would pass the size a lease returns; the cell was not written."""
