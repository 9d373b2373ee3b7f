"""How things end, named once: the statuses written in records and the exit statuses of the
commands, and the wrapper that turns a bad request into one line and exit 2.

Standard library only (the ground floor): ``stagelab measure`` on a bare node uses it too.
"""

from __future__ import annotations

import contextlib
import errno
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from stagelab.core.errors import UserError

# Statuses of a notebook, an experiment, a cell or a whole run, as records write them.
OK = "ok"
FAILED = "failed"
INTERRUPTED = "interrupted"
RUNNING = "running"
PENDING = "pending"
DEADLINE = "deadline"  # stopped at a cell boundary: the next cell would pass the deadline
NO_GO = "no-go"  # the preflight found a blocking check; nothing was measured
GO = "go"

# Exit statuses of every command.
EXIT_OK = 0
EXIT_FAILED = 1  # a notebook or experiment failed, partial, or nothing was measured
EXIT_USAGE = 2  # a bad request, refused in one line before anything was created
EXIT_NO_GO = 3  # the preflight said no-go
EXIT_INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP; what was made is kept


# Control characters (C0, DEL, C1: ANSI and OSC-8 escapes start with them), line and paragraph
# separators and the bidirectional overrides: what a folder's text may use to rewrite a terminal.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                          "\u2066-\u2069]")


def printable(text: object) -> str:
    """``text`` as one line a terminal shows as it is: every control character written as its
    escape (``\\x1b``), so that a string from a record can neither colour, link, move the
    cursor nor start a line of its own."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"),
                            str(text))


# A refusal is one line a person reads: one that quotes a value of 100 KB is cut to this.
MAX_REFUSAL = 1000


def clipped(text: object, most: int = 300) -> str:
    """``text`` as :func:`printable` shows it, cut to ``most`` characters (``...`` ending what
    was cut): a refusal that quotes a stranger's value (a member name of megabytes, a
    ``--param`` value of 100 KB) stays one short line."""
    shown = printable(text)
    return shown if len(shown) <= most else shown[:most - 3] + "..."


class EscapedStream:
    """A text stream that shows what is written to it as :func:`printable` does, line by line
    (the newline is kept), and writes what its encoding cannot hold as escapes: no command's
    output can rewrite a terminal, and a terminal without UTF-8 (the C locale) gets escapes,
    never a UnicodeEncodeError."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        shown = "\n".join(printable(line) for line in text.split("\n"))
        encoding = getattr(self._stream, "encoding", None) or "utf-8"
        self._stream.write(shown.encode(encoding, "backslashreplace").decode(encoding))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """Every line a command prints, to stdout and stderr, shown through :class:`EscapedStream`
    while the block runs."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapedStream(sys.stdout), EscapedStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams


def one_line_errors(prog: str, body: Callable[[], int],
                    also: tuple[type[Exception], ...] = ()) -> int:
    """Run a command's ``body``; a :class:`UserError` prints ``prog: error: ...`` in one line
    and returns 2 (so does a name too long for the file system), an exception of ``also`` (e.g.
    a record that cannot be written) one line and 1, an interrupt one line and 130. Never a
    traceback for what the user can fix."""
    try:
        return body()
    except UserError as exc:
        print(f"{prog}: error: {clipped(exc, MAX_REFUSAL)}", file=sys.stderr)
        return EXIT_USAGE
    except also as exc:
        print(f"{prog}: error: {clipped(exc, MAX_REFUSAL)}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        print(f"{prog}: error: {printable(exc.filename)}: {exc.strerror} (a name over 255 bytes, or a "
              "path too long for this system)", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
