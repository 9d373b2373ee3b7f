"""Runs started at the same moment never collide: each kernel has private sockets, every run
finishes ok, and no socket file is left in the repository or beside the notebooks.

Before: every kernel bound the same relative `notebooks/kernel-ipc-N` sockets, and three runs
started in the same second gave "Invalid Signature", a kernel that did not answer, and a hang.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import tiny_cli
from stagelab.core import paths, rundir

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # runs at once, timed by their kernels


def socket_files_in_repository(repo: Path = paths.REPO_ROOT) -> list[str]:
    """Kernel socket files git sees anywhere in the repository, ignored ones included."""
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                             "--ignored", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    return [line for line in status.splitlines() if "kernel-ipc" in line]


def test_three_runs_at_once_all_finish_ok_and_leave_no_socket(tiny_suite, tmp_path):
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    shared, other = tiny_suite["root"], tmp_path / "other_runs"
    procs = [subprocess.Popen(tiny_cli(tiny_suite, "run", "--profile", "okonly", "--out", str(out)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for out in (shared, shared, other)]
    results = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err for _, err in results]
    summaries = rundir.list_runs(shared) + rundir.list_runs(other)
    assert len({s.run_id for s in summaries[:2]}) == 2  # the same --out: two folders
    assert [(s.status, s.notebooks) for s in summaries] == [("ok", (("10_ok", "ok"),))] * 3
    for _, err in results:
        assert "Traceback" not in err and "Invalid Signature" not in err
    assert not list(private_tmp.iterdir())  # every private socket folder was removed
    assert not list(tiny_suite["notebooks"].glob("kernel-ipc*"))
    assert not list(paths.NOTEBOOKS_DIR.glob("kernel-ipc*"))
    assert socket_files_in_repository() == []


def test_the_repository_check_sees_socket_files(tmp_path):  # the check above can fail
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "kernel-ipc-1").write_text("")
    assert socket_files_in_repository(tmp_path) == ["?? notebooks/kernel-ipc-1"]
