"""The notebooks in JupyterLab, driven through Lab's own UI in headless Chromium, as a user would.

A Lab server on loopback (random port, token) serves a temporary copy of notebooks/. For each
notebook the test inserts one cell below the ``parameters`` cell that sets tiny values (those of
the end-to-end test) and prints the kernel's interpreter, runs Run > Run All Cells, waits until
the kernel is idle, and saves the copy. The first notebook keeps ``run_dir = ""`` and so makes a
fresh interactive run folder; every later one is pointed at that folder, so the verdict notebook
decides on what 01-03 wrote there, as a user exploring in Lab would do.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from conftest import TINY
from stagelab.core import paths
from stagelab.run import execute

CHROMIUM = shutil.which("chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-default-apps", "--disable-sync",
                 "--no-first-run"]
# Lab settings for a quiet, deterministic session: no news prompt, every cell in the DOM.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": '{"fetchNews": "false"}',
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": '{"windowingMode": "none"}',
}
KERNEL_MARK = "KERNEL_PYTHON="
# The kernel has started and answered: Lab's status bar reads "Python (stagelab) | Idle" (Run All
# clicked before that can be dropped).
KERNEL_READY = """() => (document.querySelector('#jp-main-statusbar')?.innerText || '')
  .includes('| Idle')"""
RUN_STARTED = """() => Array.from(document.querySelectorAll(
  '.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')).some(e => /[*\\d]/.test(e.textContent))"""
RUN_FINISHED = """() => {
  const prompts = Array.from(document.querySelectorAll(
    '.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')).map(e => e.textContent);
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  return indicator && indicator.getAttribute('data-status') === 'idle'
    && !prompts.some(t => t.includes('*')) && prompts.some(t => /\\d/.test(t));
}"""
# Index of the parameters cell, found as a user would: the code cell that assigns run_dir.
PARAMETERS_CELL = """() => {
  const cells = Array.from(document.querySelectorAll('.jp-NotebookPanel .jp-Cell'));
  const index = cells.findIndex(c => c.classList.contains('jp-CodeCell')
    && c.querySelector('.cm-content').innerText.split('\\n').some(l => l.startsWith('run_dir =')));
  return index >= 0 ? index : null;
}"""


def error_outputs(notebook: nbformat.NotebookNode) -> list[str]:
    """``ename: evalue`` of every error output (tracebacks); warnings on stderr are not errors."""
    return [f"{out.ename}: {out.evalue}" for cell in notebook.cells if cell.cell_type == "code"
            for out in cell.outputs if out.output_type == "error"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_serving(server: subprocess.Popen, url: str, log: Path,
                        timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"jupyter lab exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def chromium() -> str:
    """Debian's chromium; the test is skipped without it, except under CI, where it fails."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make test` installs Debian's chromium package")
        pytest.skip("chromium is not installed (make test installs it)")
    return CHROMIUM


@pytest.fixture
def lab(tmp_path):
    """A Lab server on a copy of notebooks/; yields (base URL, token, root); always shut down."""
    execute.ensure_kernel()  # the project's kernel, first on JUPYTER_PATH (also for the server)
    root = shutil.copytree(paths.NOTEBOOKS_DIR, tmp_path / "notebooks")
    settings = tmp_path / "settings"
    for name, text in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(text)
    port, token = _free_port(), os.urandom(16).hex()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
               f"--LabApp.user_settings_dir={settings}",
               f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--LabApp.news_url=", *(["--allow-root"] if os.geteuid() == 0 else [])]
    log = tmp_path / "lab.log"
    with log.open("w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(server, f"{base}/api/status?token={token}", log)
        yield base, token, root
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def new_interactive_folders():
    """A function listing the interactive run folders made since the test began (under
    papermill_runs/); they are removed afterwards."""
    before = set(paths.RUNS_DIR.glob("*_interactive*"))
    seen: set[Path] = set()

    def made() -> list[Path]:
        seen.update(set(paths.RUNS_DIR.glob("*_interactive*")) - before)
        return sorted(seen)

    yield made
    for folder in made():
        shutil.rmtree(folder, ignore_errors=True)


def _run_in_lab(page, base: str, token: str, name: str, values: dict) -> None:
    """Open a notebook in Lab, add a cell of values below its parameters, run all, save."""
    page.goto(f"{base}/lab/tree/{name}.ipynb?reset&token={token}")
    page.wait_for_function(KERNEL_READY, timeout=180_000)
    parameters = page.wait_for_function(PARAMETERS_CELL).json_value()
    cell = page.locator(".jp-NotebookPanel .jp-Cell").nth(parameters)
    cell.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # insert a cell below, as a user would
    page.keyboard.press("Enter")
    assignments = "".join(f"{key} = {value!r}; " for key, value in values.items())
    page.keyboard.insert_text(f"{assignments}import sys; print({KERNEL_MARK!r} + sys.executable)")
    page.keyboard.press("Escape")
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
    page.wait_for_function(RUN_STARTED)
    page.wait_for_function(RUN_FINISHED, timeout=240_000)
    page.keyboard.press("Control+s")
    page.wait_for_function(  # saved: the tab no longer marked dirty
        "() => !document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty')")


def _shut_down_kernels(base: str, token: str) -> None:
    headers = {"Authorization": f"token {token}"}
    listing = urllib.request.Request(f"{base}/api/kernels", headers=headers)
    with urllib.request.urlopen(listing) as response:
        kernels = json.load(response)
    for kernel in kernels:
        urllib.request.urlopen(urllib.request.Request(
            f"{base}/api/kernels/{kernel['id']}", method="DELETE", headers=headers)).close()


def test_error_outputs_are_tracebacks_not_warnings():
    nb = new_notebook(cells=[
        new_code_cell("w", outputs=[new_output("stream", name="stderr", text="UserWarning: x")]),
        new_code_cell("1/0", outputs=[new_output("error", ename="ZeroDivisionError",
                                                 evalue="division by zero", traceback=[])])])
    assert error_outputs(nb) == ["ZeroDivisionError: division by zero"]
    nb.cells.pop()
    assert error_outputs(nb) == []


def _check_saved(path: Path) -> None:
    """Every code cell of the saved notebook ran, none raised, and the kernel was the project's."""
    saved = nbformat.read(str(path), as_version=4)
    code = [c for c in saved.cells if c.cell_type == "code"]
    assert error_outputs(saved) == [], path.name
    assert all(c.execution_count for c in code), f"{path.name}: a cell did not run"
    printed = "".join(o.get("text", "") for c in code for o in c.outputs)
    assert f"{KERNEL_MARK}{sys.executable}\n" in printed, (path.name, printed[:500])


@pytest.mark.serial  # a browser and JupyterLab
@pytest.mark.slow
def test_every_notebook_runs_in_jupyterlab_with_the_project_kernel(chromium, lab, tmp_path,
                                                                   new_interactive_folders):
    from playwright.sync_api import sync_playwright

    base, token, root = lab
    names = sorted(p.stem for p in root.glob("*.ipynb"))
    committed = {name: (paths.NOTEBOOKS_DIR / f"{name}.ipynb").read_bytes() for name in names}
    run_dir = ""  # the first notebook makes the interactive folder; the others write into it
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(90_000)
        try:
            for name in names:
                _run_in_lab(page, base, token, name, {"run_dir": run_dir, **TINY.get(name, {})})
                kernel = page.inner_text(".jp-NotebookPanel-toolbar .jp-Toolbar-kernelName")
                assert kernel == "Python (stagelab)", name
                _shut_down_kernels(base, token)
                _check_saved(root / f"{name}.ipynb")
                if not run_dir:
                    made = new_interactive_folders()
                    assert len(made) == 1, made
                    run_dir = str(made[0])
        except Exception:
            page.screenshot(path=str(tmp_path / "lab_failure.png"))  # what Lab showed
            raise
        finally:
            browser.close()
    folder = Path(run_dir)
    assert new_interactive_folders() == [folder]  # one folder for the whole session
    assert folder.name.endswith("_interactive")
    assert sorted(p.name for p in (folder / "data").glob("*.parquet"))
    assert (folder / "verdict.json").exists()
    assert all((paths.NOTEBOOKS_DIR / f"{name}.ipynb").read_bytes() == committed[name]
               for name in names)  # Lab saved the copies only
