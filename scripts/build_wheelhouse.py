"""Build a wheel bundle to install stagelab on an offline GPU node (``make wheelhouse``).

GPU nodes are often air-gapped, with torch preinstalled. This downloads, on a machine with a
package index, wheels of every runtime dependency of stagelab (from pyproject.toml, torch and the
CUDA libraries excluded) for the node's Python and platform, plus the build backend that an
editable install needs, then checks that the bundle resolves offline for that Python and platform.
On the node: ``make gpu-evidence`` or ``make run OFFLINE_WHEELS=wheelhouse PROFILE=full``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "any"]
PREINSTALLED = frozenset({"torch"})  # the node's own build, matched to its driver


def requirements(extras: list[str], skip: set[str],
                 preinstalled: frozenset[str] = PREINSTALLED) -> list[str]:
    """Runtime (and the named extras') requirements of stagelab, minus preinstalled ones, plus
    the build backend of its editable install."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    dropped = preinstalled | {name.lower() for name in skip}
    keep = [r for r in wanted if re.split(r"[<>=!~ \[]", r, maxsplit=1)[0].lower() not in dropped]
    return keep + ["setuptools>=68"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dest", type=Path, default=REPO / "wheelhouse")
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--platform", action="append", default=None,
                        help="wheel platform tag (repeatable); default manylinux x86_64 tags")
    parser.add_argument("--extra", action="append", default=[], help="also bundle an extra")
    parser.add_argument("--skip", action="append", default=[], metavar="NAME",
                        help="leave out a requirement the node already has (repeatable)")
    args = parser.parse_args()
    target = ["--only-binary=:all:", "--python-version", args.python_version,
              "--implementation", "cp"]
    for platform in args.platform or PLATFORMS:
        target += ["--platform", platform]
    wanted = requirements(args.extra, set(args.skip))
    command = [sys.executable, "-m", "pip", "download", *target, "-d", str(args.dest), *wanted]
    print(" ".join(command), file=sys.stderr)
    status = subprocess.call(command)
    wheels = sorted(args.dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB in {args.dest}", file=sys.stderr)
    return status or verify(args.dest, target, wanted)


def verify(dest: Path, target: list[str], wanted: list[str]) -> int:
    """Resolve the bundle for the node's Python and platform from ``dest`` alone (offline,
    ignoring what this machine has installed): it must hold everything but what was skipped."""
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--isolated", "--dry-run",
                               "--quiet", "--no-index", "--find-links", str(dest), "--target",
                               scratch, *target, *wanted], capture_output=True, text=True)
    if proc.returncode:
        print(f"the bundle is incomplete: {proc.stderr.strip().splitlines()[-1]}", file=sys.stderr)
        return proc.returncode
    print("the bundle resolves offline for the node (skipped packages and torch aside)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
