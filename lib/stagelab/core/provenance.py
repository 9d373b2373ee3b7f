"""Which source made a measurement, without git: a lent node copies the working tree but not
``.git``, so ``measured.json`` records the git tree id of ``lib/stagelab`` computed with the
standard library (the id ``git write-tree`` would give those files), and a commit named in the
environment (``STAGELAB_COMMIT``). Back where git lives, :func:`matching_commit` finds the
commit whose ``lib/stagelab`` has that tree id.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from stagelab.core import paths

COMMIT_ENV = "STAGELAB_COMMIT"
SOURCE = "lib/stagelab"  # the fingerprinted folder, relative to the repository
# What the repository's .gitignore leaves out of lib/stagelab (never part of a commit).
IGNORED_NAMES = frozenset({"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".cache"})
IGNORED_SUFFIXES = (".pyc", ".egg-info")
SEARCHED_COMMITS = 5000  # the newest commits of every branch that matching_commit looks at


def _object_id(kind: str, body: bytes) -> bytes:
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).digest()


def _ignored(name: str) -> bool:
    return name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def _tree(folder: Path) -> bytes | None:
    """The binary id of ``folder`` as a git tree object (None for a folder git would not
    store: empty once ignored files are left out)."""
    entries = []
    for path in folder.iterdir():
        if _ignored(path.name):
            continue
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            entry = ("120000", path.name, _object_id("blob", os.readlink(path).encode()))
        elif stat.S_ISDIR(mode):
            sub = _tree(path)
            if sub is None:
                continue
            entry = ("40000", path.name + "/", sub)  # git sorts a tree as if named "name/"
        elif stat.S_ISREG(mode):  # the package holds no executable (a test checks git's
            # index), so a copy that marks its files executable still names the same tree
            entry = ("100644", path.name, _object_id("blob", path.read_bytes()))
        else:
            continue
        entries.append(entry)
    if not entries:
        return None
    entries.sort(key=lambda e: e[1].encode())
    body = b"".join(f"{mode} {name.rstrip('/')}".encode() + b"\0" + oid
                    for mode, name, oid in entries)
    return _object_id("tree", body)


def tree_id(folder: Path | str) -> str | None:
    """The git tree id (hex) of ``folder``'s files as they are on disk, ignored files left out;
    None when it holds nothing git would store."""
    found = _tree(Path(folder))
    return found.hex() if found is not None else None


def source_record(repo: Path = paths.REPO_ROOT) -> dict[str, Any]:
    """What ``measured.json`` records of the source: the tree id of ``lib/stagelab`` and the
    commit named in ``STAGELAB_COMMIT`` (None where unset)."""
    return {"path": SOURCE, "tree": tree_id(Path(repo) / SOURCE),
            "commit_env": os.environ.get(COMMIT_ENV) or None}


def matching_commit(tree: str | None, repo: Path = paths.REPO_ROOT) -> str | None:
    """The newest commit (of any branch, among the newest :data:`SEARCHED_COMMITS`) whose
    ``lib/stagelab`` has the tree id ``tree``; None without git, or when none has it."""
    if not tree:
        return None

    def git(*args: str, given: str | None = None) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], input=given, capture_output=True,
                              text=True, check=True, timeout=60).stdout

    try:
        commits = git("rev-list", "--all", f"--max-count={SEARCHED_COMMITS}").split()
        found = git("cat-file", "--batch-check=%(objectname)",
                    given="".join(f"{c}:{SOURCE}\n" for c in commits)).splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((c for c, oid in zip(commits, found) if oid.strip() == tree), None)
