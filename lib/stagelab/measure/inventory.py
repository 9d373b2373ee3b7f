"""What a measuring node has, recorded beside its measurements (``inventory.json`` and the
manifest's ``versions``): the Python, torch, CUDA and driver versions, the installed
distributions, the compilers, ``nvidia-smi -q``. The standard library only, so that it runs on
a node with Python and torch alone.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

COMPILERS = ("c++", "g++", "clang++", "gcc", "cc", "nvcc")


def versions(snap: Mapping[str, Any]) -> dict[str, Any]:
    """Python, torch, CUDA, driver, and the optional extras' versions."""
    found = {}
    for name, module in (("numpy", "numpy"), ("nvidia-ml-py", "pynvml")):
        try:  # installed is not enough: None where this Python cannot import it
            found[name] = metadata.version(name) if importlib.util.find_spec(module) else None
        except (metadata.PackageNotFoundError, ImportError, ValueError):
            found[name] = None
    return {"python": platform.python_version(), "torch": snap["torch"]["torch"],
            "cuda": snap["torch"]["cuda_build"],
            "driver": (snap.get("nvml") or {}).get("driver"), **found}


def _first_line(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ((done.stdout or done.stderr).strip().splitlines() or [""])[0]


def inventory() -> dict[str, Any]:
    """What the node has: installed distributions, compilers, ``nvidia-smi -q``."""
    distributions = sorted({(d.metadata["Name"] or "?", d.version)
                            for d in metadata.distributions()}, key=lambda d: d[0].lower())
    compilers = {name: {"path": shutil.which(name),
                        "version": _first_line([name, "--version"])}
                 for name in COMPILERS if shutil.which(name)}
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True,
                                  timeout=60)
            smi = done.stdout if done.returncode == 0 else (
                f"nvidia-smi -q exited {done.returncode}: {done.stderr.strip()[:500]}")
        except (OSError, subprocess.SubprocessError) as exc:
            smi = f"nvidia-smi -q failed: {type(exc).__name__}: {exc}"
    else:
        smi = "unavailable: nvidia-smi is not on PATH"
    return {"python": sys.version, "executable": sys.executable, "platform": platform.platform(),
            "distributions": [{"name": n, "version": v} for n, v in distributions],
            "compilers": compilers, "nvidia_smi_q": smi,
            "environment": {key: os.environ.get(key) for key in
                            ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "CXX", "PYTHONPATH")}}
