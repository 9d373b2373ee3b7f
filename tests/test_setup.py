"""The set-up and the README's commands: torch that fits the machine (with PyTorch's CPU index
reachable or not), the lean install of a fresh clone, ``make lab`` as root, and every command the
README gives, as written."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from stagelab import cli
from stagelab.core import paths
from stagelab.run import profiles

SCRIPTS = paths.REPO_ROOT / "scripts"
README = (paths.REPO_ROOT / "README.md").read_text()
VENV_BIN = Path(sys.executable).parent


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


setup_venv = _load_script("setup_venv")
bench = _load_script("bench_fresh_clone")


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def cpu_index(tmp_path):
    """A wheel index on loopback that answers for torch, as PyTorch's CPU index does."""
    (tmp_path / "whl" / "cpu" / "torch").mkdir(parents=True)
    (tmp_path / "whl" / "cpu" / "torch" / "index.html").write_text("<html></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()
    server.server_close()


def test_without_a_gpu_torch_is_the_cpu_build_from_the_cpu_index(cpu_index):
    assert setup_venv.index_reachable(cpu_index)
    choice = setup_venv.choose_torch(gpu=False, cpu_index=cpu_index, find_links=("/wheels",))
    assert (choice.requirement, choice.index_url) == ("torch==2.13.0", cpu_index)
    assert choice.find_links == ("/wheels",)
    assert f"the CPU build from {cpu_index}" in choice.reason


def test_an_unreachable_cpu_index_falls_back_to_pypis_default():
    unreachable = f"http://127.0.0.1:{_closed_port()}/whl/cpu"
    assert not setup_venv.index_reachable(unreachable)
    choice = setup_venv.choose_torch(gpu=False, cpu_index=unreachable)
    assert (choice.requirement, choice.index_url) == ("torch==2.13.0", None)  # PyPI's build
    assert f"{unreachable} cannot be reached" in choice.reason


def test_with_a_gpu_torch_is_pypis_default_build_and_no_index_is_asked():
    asked = []
    choice = setup_venv.choose_torch(gpu=True, cpu_index="unused", reachable=asked.append,
                                     find_links=("/wheels",))
    assert (choice.requirement, choice.index_url, choice.find_links) == ("torch>=2.4", None, ())
    assert asked == []


def test_pips_local_wheel_folders_are_passed_on_only_when_they_exist(tmp_path, monkeypatch):
    (tmp_path / "wheels").mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", f"{tmp_path / 'wheels'} {tmp_path / 'missing'}")
    base_python = Path(sys.base_prefix, "bin", "python3")  # the set-up's, with pip; not .venv's
    folders = setup_venv.local_wheel_folders(str(base_python))
    assert str(tmp_path / "wheels") in folders
    assert str(tmp_path / "missing") not in folders


def _recorder(path: Path) -> Path:
    """An executable that appends its arguments, one call a line, to ``path``.calls."""
    path.write_text(f"#!/bin/sh\necho \"$@\" >> '{path}.calls'\n")
    path.chmod(0o755)
    return path


def test_uv_installs_into_the_environment_from_the_chosen_index(tmp_path):
    uv = _recorder(tmp_path / "uv")
    installer = setup_venv.Installer(tmp_path / "venv" / "bin" / "python", uv)
    installer.install(["torch==2.13.0"], "https://cpu.example/whl", ("/wheels",))
    assert Path(f"{uv}.calls").read_text().split() == [
        "pip", "install", "--quiet", "--python", str(tmp_path / "venv" / "bin" / "python"),
        "--index-url", "https://cpu.example/whl", "--find-links", "/wheels", "torch==2.13.0"]


def test_without_uv_pip_of_the_environment_installs(tmp_path):
    python = _recorder(tmp_path / "python")
    installer = setup_venv.Installer(python, None)
    installer.install(["--editable", "/repo[lab]"])
    assert installer.name == "pip"
    assert Path(f"{python}.calls").read_text().split() == [
        "-m", "pip", "install", "--quiet", "--editable", "/repo[lab]"]


def test_a_failed_install_stops_the_set_up_naming_the_command(tmp_path):
    failing = tmp_path / "uv"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(0o755)
    with pytest.raises(SystemExit, match=r"set-up failed \(3\): .*uv pip install"):
        setup_venv.Installer(tmp_path / "python", failing).install(["numpy"])


def test_uv_on_path_is_taken_before_installing_one(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    uv = _recorder(tmp_path / "bin" / "uv")
    monkeypatch.setenv("PATH", f"{uv.parent}{os.pathsep}{os.environ['PATH']}")
    assert setup_venv.find_uv(tmp_path / "venv") == uv
    assert not (tmp_path / "venv").exists()  # nothing installed


def test_an_environment_with_torch_keeps_it(capsys):
    nothing = setup_venv.Installer(Path(sys.executable), uv=Path("/nonexistent/uv"))
    setup_venv.ensure_torch(nothing, cpu_index="http://127.0.0.1:9/unused")
    import torch

    assert capsys.readouterr().out == f"torch {torch.__version__}: already installed\n"


@pytest.mark.slow  # make check's fast lane leaves it to make test
def test_the_bytecode_of_what_a_run_imports_is_written_though_the_environment_says_not(
        tmp_path, monkeypatch, capsys):
    (tmp_path / "warm_me.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(setup_venv, "RUN_IMPORTS", ("warm_me", "no_such_module_anywhere"))
    setup_venv.compile_bytecode(Path(sys.executable), [])
    assert Path(importlib.util.cache_from_source(str(tmp_path / "warm_me.py"))).is_file()
    said = capsys.readouterr().out
    assert "bytecode: no_such_module_anywhere not imported (ModuleNotFoundError" in said
    assert re.search(r"^bytecode: written for what a run imports \(\d+ modules\) in \d+ s$",
                     said, re.M)


def test_bytecode_that_cannot_be_written_does_not_stop_the_set_up(tmp_path, capsys):
    setup_venv.compile_bytecode(tmp_path / "no-python", ["fleet"])
    assert capsys.readouterr().out.startswith("bytecode: not written (")


def test_the_benchmark_splits_set_up_from_the_run():
    output = ("+ uv pip install ...\nset-up: what a headless run needs installed with uv in 17 s\n"
              "  set-up: the extras lab installed with uv in 4 s  \nreport: x/index.html\n")
    assert bench.setup_seconds(output) == 21
    assert bench.setup_seconds("report: x/index.html\n") == 0


def _make(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(paths.REPO_ROOT), *args], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=600)


def test_make_run_installs_no_extra_and_lab_and_test_add_theirs(tmp_path):
    venv = tmp_path / "venv"
    dry = {target: _make("-n", target, f"VENV={venv}").stdout for target in ("run", "lab", "test")}
    assert "--extra" not in dry["run"] and "stagelab run --profile quick" in dry["run"]
    assert "--extra lab" in dry["lab"] and "--extra test" not in dry["lab"]
    assert "--extra lab" in dry["test"] and "--extra test" in dry["test"]


def test_the_projects_jupyter_config_strips_outputs_of_tracked_notebooks_on_save(
        tmp_path, monkeypatch):
    """Before: saving a notebook in Lab wrote its outputs into the tracked notebooks/*.ipynb."""
    if importlib.util.find_spec("jupyter_server") is None:
        pytest.skip("jupyter_server is not installed (make lab and make test install it)")
    import nbformat
    from jupyter_server.services.contents.filemanager import FileContentsManager

    from stagelab.run import lab

    config = json.loads((lab.CONFIG_DIR / "jupyter_server_config.json").read_text())
    assert config["LabApp"]["news_url"] is None  # no news prompt, nothing fetched
    hook = config["FileContentsManager"]["pre_save_hook"]
    tracked = tmp_path / "notebooks"
    (tracked / "scratch").mkdir(parents=True)
    monkeypatch.setattr(paths, "NOTEBOOKS_DIR", tracked)
    manager = FileContentsManager(root_dir=str(tracked), pre_save_hook=hook)
    cell = nbformat.v4.new_code_cell("1", execution_count=3, outputs=[
        nbformat.v4.new_output("execute_result", data={"text/plain": "1"}, execution_count=3)])
    for name in ("01_d2h_staging.ipynb", "scratch/mine.ipynb"):
        manager.save({"type": "notebook", "format": "json",
                      "content": nbformat.v4.new_notebook(cells=[cell.copy()])}, name)
    saved = nbformat.read(str(tracked / "01_d2h_staging.ipynb"), as_version=4).cells[0]
    assert saved.outputs == [] and saved.execution_count is None and saved.source == "1"
    mine = nbformat.read(str(tracked / "scratch" / "mine.ipynb"), as_version=4).cells[0]
    assert len(mine.outputs) == 1  # a notebook of the user's own keeps what it shows
    assert "JUPYTER_CONFIG_PATH=" in _make("-n", "lab", "VENV=/nowhere").stdout


def test_saving_a_tracked_notebook_run_in_lab_leaves_it_unchanged_in_git(tmp_path, monkeypatch):
    """Before: saving in Lab stripped outputs but wrote the kernel's whole ``language_info``,
    so a tracked notebook showed as modified in git. Each committed notebook, run and viewed as
    Lab leaves it, is saved byte for byte as committed."""
    if importlib.util.find_spec("jupyter_server") is None:
        pytest.skip("jupyter_server is not installed (make lab and make test install it)")
    import nbformat
    from jupyter_server.services.contents.filemanager import FileContentsManager

    from stagelab.run import lab

    tracked = tmp_path / "notebooks"
    tracked.mkdir()
    monkeypatch.setattr(paths, "NOTEBOOKS_DIR", tracked)
    manager = FileContentsManager(root_dir=str(tracked), pre_save_hook=lab.strip_outputs)
    committed = sorted(paths.REPO_ROOT.glob("notebooks/[0-9]*.ipynb"))
    assert committed
    for source in committed:
        notebook = nbformat.read(str(source), as_version=4)
        notebook.metadata["language_info"] = {
            "name": "python", "version": "3.11.7", "mimetype": "text/x-python",
            "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py"}
        for cell in notebook.cells:
            cell.metadata.update(scrolled=True, execution={"iopub.status.idle": "2026"})
            if cell.cell_type == "code":
                cell.execution_count = 1
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x")]
        manager.save({"type": "notebook", "format": "json", "content": notebook}, source.name)
        assert (tracked / source.name).read_bytes() == source.read_bytes(), source.name


def test_lab_starts_the_projects_kernel_without_asking_and_never_asks_for_news():
    """The settings `make lab` gives Lab: the project's kernel as the default, started without
    a kernel dialog; the news prompt answered "never"."""
    from stagelab.run import lab

    config = json.loads((lab.CONFIG_DIR / "jupyter_server_config.json").read_text())
    assert config["MappingKernelManager"]["default_kernel_name"] == setup_venv.KERNEL_NAME
    overrides = json.loads((lab.CONFIG_DIR / "lab" / "overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    assert overrides["@jupyterlab/notebook-extension:tracker"]["autoStartDefaultKernel"] is True
    shown = _make("-n", "lab", "VENV=/nowhere").stdout
    assert f"--LabApp.app_settings_dir='{lab.CONFIG_DIR / 'lab'}'" in shown


@pytest.mark.serial  # a JupyterLab server
@pytest.mark.slow
def test_make_lab_as_root_starts_and_answers(tmp_path):
    """`make lab` as the README gives it (as root in CI: --allow-root), on loopback, then shut
    down through Jupyter's own API."""
    if importlib.util.find_spec("jupyterlab") is None:
        if os.environ.get("CI"):
            pytest.fail("jupyterlab is missing: `make test` installs the lab extra")
        pytest.skip("jupyterlab is not installed (make lab and make test install it)")
    port, token = _closed_port(), os.urandom(16).hex()
    venv = Path(sys.prefix)
    stamps = [f"--old-file={venv}/.installed", f"--old-file={venv}/.extra-lab"]  # installed
    lab_args = (f"LAB_ARGS=--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} "
                f"--ServerApp.port_retries=0 --IdentityProvider.token={token}")
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    command = ["make", "-C", str(paths.REPO_ROOT), *stamps, "lab", f"VENV={venv}", lab_args]
    shown = subprocess.run([*command[:-2], "-n", *command[-2:]], capture_output=True, text=True)
    assert ("--allow-root" in shown.stdout) == (os.geteuid() == 0), shown.stdout
    log = tmp_path / "lab.log"
    with log.open("w") as out:
        lab = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    headers = {"Authorization": f"token {token}"}
    try:
        status = _wait_for_json(f"http://127.0.0.1:{port}/api/status", headers, lab, log)
        assert "started" in status
        _lab_saves_tracked_notebooks_without_outputs(port, headers)
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/lab", headers=headers)) as response:
            assert '"news": {"disabled": true}' in response.read().decode()  # no news prompt
        notification = _wait_for_json(  # the news prompt answered "never", from overrides.json
            f"http://127.0.0.1:{port}/lab/api/settings/@jupyterlab/apputils-extension:notification",
            headers, lab, log)
        assert notification["schema"]["properties"]["fetchNews"]["default"] == "false", notification
        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/api/shutdown", method="POST", headers=headers)).close()
        assert lab.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if lab.poll() is None:
            os.killpg(lab.pid, 15)
            lab.wait(timeout=30)


def _lab_saves_tracked_notebooks_without_outputs(port: int, headers: dict) -> None:
    """Save a notebook with an output into notebooks/ through Lab's contents API, as Ctrl-S
    does: the file written has no output (the project's pre_save_hook); it is removed after."""
    import nbformat

    name = f"zz_probe_{os.getpid()}.ipynb"
    cell = nbformat.v4.new_code_cell("1", execution_count=1, outputs=[
        nbformat.v4.new_output("execute_result", data={"text/plain": "1"}, execution_count=1)])
    body = json.dumps({"type": "notebook", "format": "json",
                       "content": nbformat.v4.new_notebook(cells=[cell])}).encode()
    try:
        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/api/contents/{name}", data=body, method="PUT",
            headers={**headers, "Content-Type": "application/json"})).close()
        saved = nbformat.read(str(paths.NOTEBOOKS_DIR / name), as_version=4)
        assert saved.cells[0].outputs == [] and saved.cells[0].execution_count is None
    finally:
        (paths.NOTEBOOKS_DIR / name).unlink(missing_ok=True)


def _wait_for_json(url: str, headers: dict, process: subprocess.Popen, log: Path,
                   timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"make lab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                        timeout=5) as response:
                return json.load(response)
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"make lab did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")


@pytest.mark.serial  # a whole set-up
@pytest.mark.slow
def test_a_fresh_clone_sets_up_lean_with_the_cpu_index_unreachable(tmp_path):
    """`make setup` in a fresh clone (of the committed HEAD), PyTorch's CPU index pointed at a
    closed port: PyPI's default torch is taken, its build is said and true, and only what a
    headless run needs is installed, with the `stagelab` command listing every profile."""
    repo = tmp_path / "stagelab"
    bench.clone(paths.REPO_ROOT, repo)
    unreachable = f"http://127.0.0.1:{_closed_port()}/whl/cpu"
    done = subprocess.run(["make", "-C", str(repo), "setup"], capture_output=True, text=True,
                          env=dict(os.environ, TORCH_CPU_INDEX=unreachable,
                                   PYTHONDONTWRITEBYTECODE="1"), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{unreachable} cannot be reached" in done.stdout
    assert "bytecode: written" in done.stdout
    assert list((repo / "lib" / "stagelab" / "__pycache__").glob("cli.*.pyc"))
    assert list((repo / ".venv").glob("lib/python3*/site-packages/torch/__pycache__/__init__.*.pyc"))
    python = repo / ".venv" / "bin" / "python"
    truth = subprocess.run([str(python), "-c", setup_venv.TORCH_BUILD_PROBE], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert f"torch {truth}\n" in done.stdout
    installed = subprocess.run([str(python), "-c", "import importlib.util as u; print("
                                "[m for m in ('jupyterlab', 'pytest', 'playwright') if "
                                "u.find_spec(m)])"], capture_output=True, text=True, check=True)
    assert installed.stdout.strip() == "[]"
    helped = subprocess.run([str(repo / ".venv" / "bin" / "stagelab"), "run", "--help"],
                            capture_output=True, text=True, check=True).stdout
    profiles_file = repo / paths.PROFILES_FILE.relative_to(paths.REPO_ROOT)
    assert all(name in helped for name in profiles.load_profiles(profiles_file))


# The README's commands, as written.

def _readme_commands() -> list[str]:
    """Every shell command the README gives: code-block lines and code spans that start with
    `make` or `stagelab` (comments dropped)."""
    blocks = [b.replace("\\\n", " ") for b in re.findall(r"```sh\n(.*?)```", README, re.S)]
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()
             if line.startswith(("make ", "stagelab "))]
    spans = re.findall(r"`((?:make [a-z]|stagelab [a-z])[^`]*)`", README)
    return [c for c in dict.fromkeys([*lines, *spans]) if c]


def _stagelab_commands() -> list[list[str]]:
    return [shlex.split(re.sub(r"[\[\]]", " ", c))[1:] for c in _readme_commands()
            if c.startswith("stagelab ")]


def test_the_readme_activates_the_environment_before_its_first_stagelab_command():
    activation = README.index(". .venv/bin/activate")
    first = min(README.index(f"`stagelab {words[0]}") for words in _stagelab_commands())
    assert activation < first
    assert (VENV_BIN / "activate").exists() and (VENV_BIN / "stagelab").exists()


def test_every_stagelab_command_of_the_readme_exists_with_its_options_and_profiles():
    subparsers = next(a for a in cli._parser()._actions if a.dest == "command").choices
    commands = _stagelab_commands()
    documented = {words[0] for words in commands}
    assert set(cli.COMMANDS) <= documented, (
        f"the README's commands table lacks stagelab {', '.join(set(cli.COMMANDS) - documented)}")
    assert documented <= set(cli.COMMANDS), documented - set(cli.COMMANDS)
    for words in commands:
        options = set(subparsers[words[0]]._option_string_actions)
        given = [w.split("=")[0] for w in words if w.startswith("--")]
        assert set(given) <= options, (words, options)
        for flag, value in zip(words, words[1:]):
            if flag == "--profile":
                assert value in profiles.load_profiles(), words


def test_every_stagelab_command_of_the_readme_is_exercised_by_a_test():
    sources = "".join(p.read_text() for p in (paths.REPO_ROOT / "tests").glob("test_*.py"))
    for name in {words[0] for words in _stagelab_commands()}:
        called = rf"(main\(\[|\[\"stagelab\",)\s*\"{name}\""  # cli.main or the command
        assert re.search(called, sources), f"no test calls `stagelab {name}`"


# Where each make target of the README is exercised.
MAKE_TARGETS = {"run": "scripts/bench_fresh_clone.py", "test": ".ci/run", "check": ".ci/run",
                "lab": "test_make_lab_as_root_starts_and_answers",
                "setup": "test_a_fresh_clone_sets_up_lean_with_the_cpu_index_unreachable",
                "clean": "test_make_setup_passes_the_torch_index_on"}


def test_every_make_target_of_the_readme_exists_and_is_exercised():
    targets = {c.split()[1] for c in _readme_commands() if c.startswith("make ")}
    assert targets and targets <= set(MAKE_TARGETS), targets - set(MAKE_TARGETS)
    here = Path(__file__).read_text()
    for target in targets:
        assert _make("-n", target, "VENV=/nonexistent").returncode == 0, target
        where = MAKE_TARGETS[target]
        assert (paths.REPO_ROOT / where).exists() or f"def {where}(" in here, where


def test_the_installed_stagelab_command_runs_as_the_readme_says():
    """With the environment activated (its bin/ first on PATH), `stagelab` is the command."""
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    helped = subprocess.run(["stagelab", "run", "--help"], capture_output=True, text=True,
                            env=env, check=True).stdout
    assert f"{paths.PROFILES_FILE.name}: {', '.join(profiles.load_profiles())}" in " ".join(
        helped.split())
    snapshot = subprocess.run(["stagelab", "env", "--json"], capture_output=True, text=True,
                              env=env, check=True).stdout
    assert json.loads(snapshot)


def test_make_help_lists_every_target_with_what_it_does():
    done = _make("--no-print-directory", "help")
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0]: line.split(None, 1)[1] for line in done.stdout.splitlines()}
    makefile = (paths.REPO_ROOT / "Makefile").read_text()
    phony = next(line for line in makefile.splitlines() if line.startswith(".PHONY:"))
    assert set(listed) == set(phony.split()[1:])  # every target, nothing else
    assert all(words.strip() for words in listed.values())
    assert _make("--no-print-directory").stdout == done.stdout  # `make` alone says it too


def test_a_torch_index_given_is_where_torch_comes_from_gpu_or_not():
    cu126 = "https://download.pytorch.org/whl/cu126"
    for gpu in (True, False):
        choice = setup_venv.choose_torch(gpu=gpu, cpu_index="http://unused",
                                         reachable=lambda _url: False, torch_index=cu126)
        assert (choice.requirement, choice.index_url) == (setup_venv.GPU_TORCH, cu126)
    cpu = setup_venv.choose_torch(gpu=True, cpu_index="http://unused",
                                  torch_index="https://download.pytorch.org/whl/cpu/")
    assert cpu.requirement == setup_venv.CPU_TORCH


def test_the_driver_is_read_from_nvidia_smi_and_a_too_new_cuda_build_is_named():
    header = ("| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |")
    driver = setup_venv.read_driver(header)
    assert (driver.version, driver.cuda, driver.cuda_major) == ("550.54.15", "12.4", 12)
    assert setup_venv.read_driver("No devices were found") is None
    assert setup_venv.driver_fit(driver, "12.8") is None  # minor version compatibility
    advice = setup_venv.driver_fit(driver, "13.0")
    assert "driver >= 580" in advice and "TORCH_INDEX=https://download.pytorch.org/whl/cu126" in advice


def test_make_setup_passes_the_torch_index_on():
    dry = subprocess.run(["make", "-n", "-B", "setup", "TORCH_INDEX=http://example.invalid/cu126"],
                         cwd=paths.REPO_ROOT, capture_output=True, text=True).stdout
    assert "--torch-index 'http://example.invalid/cu126'" in dry
    plain = subprocess.run(["make", "-n", "-B", "setup"], cwd=paths.REPO_ROOT,
                           capture_output=True, text=True).stdout
    assert "--torch-index" not in plain
    cleaned = subprocess.run(["make", "--no-print-directory", "-n", "clean",
                              "VENV=/nonexistent/venv"],
                             cwd=paths.REPO_ROOT, capture_output=True, text=True).stdout
    assert cleaned.split() == ["rm", "-rf", "/nonexistent/venv"]  # the README's `make clean setup`
