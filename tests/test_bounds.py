"""Every input bounded before it is read, and every printed line escaped: a node's archive,
a run's figures and pages, ``--param`` values, paths given relative, a terminal without UTF-8.
Each case reproduced as an attacker or a careless user met it, then refused or fixed."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from stagelab.core import measured
from stagelab.run import fleet, fleet_node


def _archive_of(entries: list[tuple[tarfile.TarInfo, bytes]], form=tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=form) as tar:
        for info, data in entries:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _file(name: str, data: bytes = b"{}") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


# ------------------------------------------------------------------ R1: a node's archive

@pytest.mark.parametrize("form", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_a_long_name_header_is_refused_before_tarfile_reads_it_whole(tmp_path, form):
    """Before: one GNU long-name (or pax) header was read whole by tarfile before any member
    check: a 522 KB archive took 40 s and 4.1 GiB, and the whole 8 MB name became the node's
    recorded error."""
    name = "rows/" + "a" * (1 << 20)
    archive = _archive_of([_file(name)], form)
    with pytest.raises(ValueError, match="extended header of") as refused:
        fleet.unpack(archive, tmp_path / "node")
    assert len(str(refused.value)) < 400
    assert not [p for p in (tmp_path / "node").rglob("*") if p.is_file()]


def test_a_node_archive_error_is_recorded_clipped_and_escaped():
    """Before: the archive's error text, a member name of megabytes with its escapes, became
    the node's recorded error whole."""
    text = fleet.archive_error(ValueError("bad \x1b[2J" + "x" * 100_000))
    assert "\x1b" not in text and len(text) < 400 and text.endswith("...")


def test_a_member_name_with_a_control_character_or_unknown_is_refused(tmp_path):
    """Before: `fleet.unpack` accepted a member named with ESC, and any name."""
    for name in ("measured\x1b.json", "notes.txt", "rows/other.jsonl.gz"):
        with pytest.raises(ValueError, match="not a file of a measured folder"):
            fleet.unpack(_archive_of([_file(name)]), tmp_path / "node")


def test_one_file_twice_in_an_archive_is_refused(tmp_path):
    """Before: `fleet.unpack` accepted one file eight times (each written over the last)."""
    with pytest.raises(ValueError, match="twice"):
        fleet.unpack(_archive_of([_file("measured.json"), _file("measured.json")]),
                     tmp_path / "node")


def test_a_packed_measured_folder_still_unpacks(tmp_path):
    """What a node packs (pax headers for its float mtimes included) comes back whole."""
    source = tmp_path / "src"
    (source / "rows").mkdir(parents=True)
    (source / "measured.json").write_text('{"status": "ok"}')
    (source / "rows" / "step.jsonl.gz").write_bytes(b"rows")
    back = fleet.unpack(fleet_node.pack(source), tmp_path / "back")
    assert (back / "rows" / "step.jsonl.gz").read_bytes() == b"rows"
    assert set(measured.record_names()) >= {"measured.json", "rows/step.jsonl.gz"}


def test_a_chain_of_extended_headers_is_refused_not_recursed(tmp_path):
    """Before: tarfile follows a chain of pax headers by recursion: thousands of small ones
    ended in a RecursionError traceback, not a refusal."""
    header = tarfile.TarInfo("x")
    header.type = tarfile.XHDTYPE
    block = b"12 path=abc\n"
    header.size = len(block)
    raw = b"".join(header.tobuf(tarfile.USTAR_FORMAT) + block.ljust(512, b"\0")
                   for _ in range(3000))
    member = tarfile.TarInfo("measured.json")
    member.size = 2
    raw += member.tobuf(tarfile.USTAR_FORMAT) + b"{}".ljust(512, b"\0") + bytes(1024)
    import gzip
    with pytest.raises(ValueError, match="chains more than"):
        fleet.unpack(gzip.compress(raw), tmp_path / "node")


# ------------------------------------------------------------- R5: a run's figures and pages

def _sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


def test_a_giant_figure_is_refused_by_the_single_file_report(tmp_path):
    """Before: a run's figures/*.png had no bound: a 256 MiB sparse PNG made `report
    --single-file` take 29 s and 2.5 GB and write a 360 MB page."""
    from conftest import good_run
    from stagelab.core.errors import UserError
    from stagelab.present import report

    run = good_run(tmp_path / "runs")
    _sparse(run / "figures" / "01_d2h_staging_copy.png", report.MAX_FIGURE_BYTES + 1)
    with pytest.raises(UserError, match=r"01_d2h_staging_copy.png: \d+ bytes, more than"):
        report.write_single_file(run)
    assert not list(run.glob("*_report.html"))


def test_keep_refuses_a_giant_figure_and_copies_nothing_densely(tmp_path, verdict_as_recorded):
    """Before: `keep` copied a 300 MiB sparse figure densely into data/reference/."""
    from conftest import good_run
    from stagelab.core.errors import UserError
    from stagelab.present import evidence, report

    run = good_run(tmp_path / "runs")
    _sparse(run / "figures" / "01_d2h_staging_copy.png", report.MAX_FIGURE_BYTES + 1)
    with pytest.raises(UserError, match=r"not kept: .*01_d2h_staging_copy.png: \d+ bytes"):
        evidence.keep_evidence(run, tmp_path / "reference", force=True)
    assert not [p for p in (tmp_path / "reference").rglob("*.png")]


def test_a_giant_notebook_is_refused_before_its_page_is_made(tmp_path):
    from stagelab.core.errors import UserError
    from stagelab.present import report

    notebook = _sparse(tmp_path / "01_d2h_staging.ipynb", report.MAX_NOTEBOOK_BYTES + 1)
    with pytest.raises(UserError, match="more than the"):
        report.notebook_body(notebook)


# ---------------------------------------------------- R6 and the C locale: every printed line

ESC = "\x1b[2J\x1b]8;;https://example.org\x07x\x1b]8;;\x07\u202e"


def test_compare_escapes_a_manifests_cpu_model(tmp_path, capsys):
    """Before: `compare` printed a manifest's cpu_model with its control characters raw."""
    import json

    from conftest import make_run
    from stagelab import cli

    run = make_run(tmp_path / "runs", "a")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["hardware"]["host"]["cpu_model"] = f"Xeon{ESC}"
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert cli.main(["compare", str(run), "--out", str(tmp_path / "c.html")]) == 0
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out + captured.err and "\u202e" not in captured.out
    assert "\\x1b" in captured.out


def test_report_and_keep_escape_the_run_folders_name(tmp_path, capsys, verdict_as_recorded,
                                                     monkeypatch):
    """Before: `keep` and `report` printed the run folder's name with its escapes raw."""
    from conftest import good_run
    from stagelab import cli
    from stagelab.core import paths

    monkeypatch.setattr(paths, "REFERENCE_DIR", tmp_path / "reference")  # never the checkout's

    run = good_run(tmp_path / "runs")
    named = run.rename(run.parent / "run\x1b[31mred\u202e")
    assert cli.main(["report", str(named)]) == 0
    cli.main(["keep", str(named)])
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out + captured.err
    assert "\u202e" not in captured.out + captured.err and "\\x1b[31mred" in captured.out


def test_runs_and_refusals_under_the_c_locale_print_escapes_not_tracebacks(tmp_path):
    """Before: under the C locale without UTF-8 mode `runs` printed a traceback
    (UnicodeEncodeError) for a run whose profile was not ASCII, and `run` could not read its
    own notebooks (their parameters cells hold UTF-8 text)."""
    import json
    import os
    import subprocess
    import sys

    from conftest import fake_run
    from stagelab.core import rundir

    run = fake_run(tmp_path)
    manifest = rundir.read_manifest(run)
    manifest["profile"] = "quick-é×"
    rundir.write_manifest(run, manifest)
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    env.pop("PYTHONIOENCODING", None)
    done = subprocess.run([sys.executable, "-m", "stagelab", "runs", "--root", str(tmp_path)],
                          capture_output=True, env=env, timeout=120)
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr[-2000:]
    assert b"quick-\\xe9\\xd7" in done.stdout
    plan = subprocess.run([sys.executable, "-c", "from stagelab.run import profiles\n"
                           "print(len(profiles.plan_run('smoke').notebooks))"],
                          capture_output=True, env=env, timeout=120)
    assert plan.returncode == 0 and int(plan.stdout) >= 4, plan.stderr[-2000:]  # its notebooks
    assert json.loads(subprocess.run(
        [sys.executable, "-m", "stagelab", "runs", "--root", str(tmp_path), "--json"],
        capture_output=True, env=env, timeout=120).stdout)[0]["profile"] == "quick-é×"


# ------------------------------------------------------------ R7, a long value, R10: requests

def test_a_deeply_nested_param_is_one_line_and_exit_2(tmp_path, capsys):
    """Before: `--param 01_d2h_staging.rounds=[[[[...]]]]` ended in a RecursionError traceback,
    exit 1."""
    from stagelab import cli

    deep = "[" * 100_000 + "]" * 100_000
    for value in (deep, "[" * 100_000):
        code = cli.main(["run", "--profile", "smoke", "--param", f"01_d2h_staging.rounds={value}",
                         "--out", str(tmp_path)])
        err = capsys.readouterr().err
        assert code == 2 and "more than 8 deep" in err
        assert len(err.splitlines()) == 1 and len(err) < 400


def test_a_refused_long_value_is_not_echoed_whole(tmp_path, capsys):
    """Before: a refused 100 KB `--param` value was echoed whole in the refusal."""
    from stagelab import cli

    code = cli.main(["run", "--profile", "smoke", "--param",
                     f"01_d2h_staging.rounds={'x' * 100_000}", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "01_d2h_staging.rounds" in err and len(err) < 1100
    assert err.rstrip().endswith("...")


def test_every_path_a_command_takes_is_resolved_where_given(tmp_path, monkeypatch):
    """Before: `run --from DIR --out RELATIVE` always failed: the notebooks, which run inside
    notebooks/, got a relative measured/ path, and the refusal said "not a measured folder"."""
    from stagelab import cli

    monkeypatch.chdir(tmp_path)
    parser = cli._parser()
    args = parser.parse_args(["run", "--from", "node", "--out", "runs"])
    assert args.from_dir == tmp_path / "node" and args.out == tmp_path / "runs"
    for argv, field in ((["keep", "run"], "run_dir"), (["report", "run"], "run_dir"),
                        (["runs", "--root", "r"], "root"), (["compare", "a"], "runs"),
                        (["measure", "--out", "m"], "out")):
        value = getattr(parser.parse_args(argv), field)
        assert all(Path(v).is_absolute() for v in (value if isinstance(value, list) else [value]))


# --------------------------------------------------------------- the Lows: links, .incoming

@pytest.mark.parametrize("href", ["da\tta:text/html,<script>alert(1)</script>",
                                  "java\nscript:alert(1)", " \x01data:text/html,x",
                                  "//evil.example/x", "\\\\evil.example/x", "/\\evil.example"])
def test_a_link_a_browser_reads_as_data_or_another_site_is_removed(href):
    """Before: a data: URL with a tab inside passed the sanitiser, and protocol-relative links
    (//host) survived."""
    from stagelab.present import sanitise

    cleaned = sanitise.sanitised_html(f'<p><a href="{href}">x</a></p>')
    assert "href" not in cleaned and "x" in cleaned


@pytest.mark.parametrize("href", ["https://example.org/a", "#notebook-01", "01_d2h_staging.html",
                                  "mailto:a@example.org"])
def test_a_link_to_the_page_or_the_web_stays(href):
    from stagelab.present import sanitise

    assert f'href="{href}"' in sanitise.sanitised_html(f'<a href="{href}">x</a>')


def test_a_keep_killed_mid_copy_leaves_nothing_git_shows():
    """Before: SIGKILL during `keep` left `.incoming-*` folders that git showed as untracked."""
    import subprocess

    from stagelab.core import paths
    from stagelab.present import evidence

    left = f"data/reference/cpu-x/{evidence.INCOMING}run-abc123/kept.json"
    done = subprocess.run(["git", "check-ignore", "-q", left], cwd=paths.REPO_ROOT)
    assert done.returncode == 0
    kept = "data/reference/cpu-x/20261201T000000Z_vm_quick/kept.json"
    assert subprocess.run(["git", "check-ignore", "-q", kept], cwd=paths.REPO_ROOT).returncode == 1


def test_the_warm_kernel_imports_nothing_a_notebook_would_not(tmp_path):
    """Before: the warm-kernel preload imported modules a notebook would not: one imported after
    `sys.path.insert` (from another folder), or after a cell that stops the notebook."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from stagelab.run import kernels

    path = tmp_path / "n.ipynb"
    nbformat.write(new_notebook(cells=[
        new_code_cell("rounds = 3\nlabel: str = 'x'"),
        new_code_cell("import sys\nsys.path.insert(0, '/elsewhere')\nimport planted"),
        new_code_cell("import json")]), path)
    assert kernels.notebook_imports(path) == ["sys"]
    nbformat.write(new_notebook(cells=[
        new_code_cell("import os"), new_code_cell("raise SystemExit('stop here')"),
        new_code_cell("import never")]), path)
    assert kernels.notebook_imports(path) == ["os"]
