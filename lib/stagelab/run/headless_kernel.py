"""The kernel a headless run starts: ipykernel, without its debugger.

ipykernel imports debugpy when it starts (half a second of every kernel's start on a 2-core VM)
so that a JupyterLab user can step through a cell; papermill never debugs. This launcher hides
debugpy from the kernel's imports, so ipykernel finds no debugger and starts without it; the
project's kernelspec, which JupyterLab uses, is unchanged (:mod:`stagelab.run.kernels`).
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

HIDDEN = "debugpy"


class HideDebugger(importlib.abc.MetaPathFinder):
    """Refuse debugpy and its submodules, as if it were not installed."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> Any:
        if fullname == HIDDEN or fullname.startswith(f"{HIDDEN}."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (a headless kernel)",
                                      name=fullname)
        return None


def main() -> None:
    """Start ipykernel as ``python -m ipykernel_launcher`` does, debugpy hidden."""
    sys.meta_path.insert(0, HideDebugger())
    if sys.path and sys.path[0] == "":
        del sys.path[0]  # as ipykernel_launcher does: the working folder is not a package root
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
