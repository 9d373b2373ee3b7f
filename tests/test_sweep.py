"""The one sweep: fault isolation, per-cell writes that survive a kill, progress, clock checks."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import textwrap
import time

import pytest

from stagelab.core import paths, schema
from stagelab.core.errors import InsufficientMemory
from stagelab.measure import bench, hardware, sweep


def cells(count: int, arms=("a", "b")) -> list[sweep.Cell]:
    return [sweep.Cell(sizes={"experiment": "e", "rows": i + 1, "vocab": 10}, arms=list(arms),
                       label=f"cell {i}") for i in range(count)]


def plan(calls: dict, **kwargs) -> sweep.CellPlan:
    return sweep.CellPlan(calls=calls, **kwargs)


def test_an_arm_that_raises_is_recorded_failed_and_the_others_go_on():
    def broken(r: int) -> None:
        if r >= 2:
            raise RuntimeError("device lost\nsecond line")

    records = sweep.run(cells(1), lambda cell: plan({"a": lambda r: None, "b": broken}),
                        rounds=4, warmup=1, device="cpu", progress=False)
    frame = schema.make_rows(records)
    timed = frame[(frame.status == "ok") & (frame.arm == "a")]
    assert list(timed["round"]) == [0, 1, 2, 3]
    failed = frame[frame.status == "failed"]
    assert list(failed.arm) == ["b"] and failed.note.iloc[0] == "RuntimeError: device lost"
    assert list(frame[(frame.arm == "b") & (frame.status == "ok")]["round"]) == [0]


def test_a_cell_that_fails_or_does_not_fit_does_not_stop_the_sweep():
    def prepare(cell: sweep.Cell) -> sweep.CellPlan:
        if cell.sizes["rows"] == 1:
            raise ValueError("cannot build the sources")
        if cell.sizes["rows"] == 2:
            raise InsufficientMemory("needs 9.00 GiB but only 1.00 GiB is free")
        return plan({"a": lambda r: None, "b": lambda r: None})

    frame = schema.make_rows(sweep.run(cells(3), prepare, rounds=2, warmup=0, device="cpu",
                                       progress=False))
    by_cell = {rows: set(part.status) for rows, part in frame.groupby("rows")}
    assert by_cell == {1: {"failed"}, 2: {"skipped"}, 3: {"ok"}}
    assert frame[frame.rows == 1].note.iloc[0] == "ValueError: cannot build the sources"


def test_an_invalid_cell_is_skipped_with_its_reason_and_unavailable_arms_are_named():
    todo = cells(2)
    todo[0].invalid = "K=20 exceeds the vocabulary V=10"
    frame = schema.make_rows(sweep.run(
        todo, lambda cell: plan({"a": lambda r: None}, unavailable={"b": "needs CUDA"}),
        rounds=1, warmup=0, device="cpu", progress=False))
    assert set(frame[frame.rows == 1].status) == {"skipped"}
    second = frame[frame.rows == 2]
    assert second[second.arm == "b"][["status", "note"]].values.tolist() == [
        ["unavailable", "needs CUDA"]]


def test_the_table_is_written_after_every_cell(tmp_path):
    sink = schema.TableSink(tmp_path, "t", run_id="r", notebook="n")
    seen = []

    def prepare(cell: sweep.Cell) -> sweep.CellPlan:
        if cell.sizes["rows"] > 1:  # by the second cell, the first is on disk
            seen.append(sorted(set(schema.read_table(tmp_path, "t").rows)))
        return plan({"a": lambda r: None})

    sweep.run(cells(3), prepare, rounds=1, warmup=0, device="cpu", sink=sink, progress=False)
    assert seen == [[1], [1, 2]]
    assert set(schema.read_table(tmp_path, "t").run_id) == {"r"}


def test_a_sweep_killed_mid_way_leaves_its_finished_cells_on_disk(tmp_path):
    script = textwrap.dedent(f"""
        import time
        from stagelab.core import schema
        from stagelab.measure import sweep
        cells = [sweep.Cell(sizes={{"experiment": "e", "rows": i + 1}}, arms=["a"], label=str(i))
                 for i in range(3)]
        def prepare(cell):
            if cell.sizes["rows"] == 2:
                time.sleep(120)  # killed here, in the second cell
            return sweep.CellPlan(calls={{"a": lambda r: None}})
        sink = schema.TableSink({str(tmp_path)!r}, "t")
        sweep.run(cells, prepare, rounds=3, warmup=0, device="cpu", sink=sink, progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    path = schema.table_path(tmp_path, "t")
    deadline = time.time() + 60
    while not path.exists() and time.time() < deadline:
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    table = schema.read_table(tmp_path, "t")
    timed = table[table["metric"] == "time"]
    assert set(table.rows) == {1} and list(timed["round"]) == [0, 1, 2]
    assert not list(tmp_path.glob("data/.*.tmp")), "no half-written file is left behind"


def test_headless_progress_is_one_line_per_cell_on_the_process_stderr(monkeypatch, capfd):
    monkeypatch.setenv(paths.HEADLESS_ENV, "1")
    notebook_output = io.StringIO()  # what a kernel shows in the notebook (and its export)
    monkeypatch.setattr(sys, "stderr", notebook_output)
    sweep.run(cells(3), lambda cell: plan({"a": lambda r: None}), rounds=2, warmup=0,
              device="cpu", label="demo")
    err = capfd.readouterr().err.strip().splitlines()
    assert err == [f"demo: cell {i + 1}/3 cell {i}: 1 ok" for i in range(3)]
    assert notebook_output.getvalue() == ""


def test_a_long_cell_says_how_far_it_is_between_its_calls(monkeypatch, capfd):
    """Before: notebook 03's one cell (every configuration an arm) printed nothing until it
    ended, and the terminal read "still running" for 250 s. A plan that asks for it gets a line
    between its calls, in the sweep's own form (the runner relays it), at most one per
    PROGRESS_EVERY_S, the first only after it; a plan that does not ask gets none."""
    monkeypatch.setenv(paths.HEADLESS_ENV, "1")
    monkeypatch.setattr(sweep, "PROGRESS_EVERY_S", 0.0)  # every call is "long" here
    seen: list[tuple[str, int]] = []

    def prepare(cell: sweep.Cell) -> sweep.CellPlan:
        told = sweep.cell_progress()
        assert told is not None and (told.index, told.total) == (cell.sizes["rows"], 2)
        say = told.call(cell)

        def between_calls(arm: str, round_index: int) -> None:
            seen.append((arm, round_index))
            say(arm, round_index)
        return plan({"a": lambda r: None, "b": lambda r: None}, between_calls=between_calls)

    sweep.run(cells(2), prepare, rounds=2, warmup=1, device="cpu", label="demo")
    err = capfd.readouterr().err.strip().splitlines()
    assert sorted(seen) == sorted([(arm, r) for arm in "ab" for r in (-1, 0, 1)] * 2)
    first = [line for line in err if line.startswith("demo: cell 1/2 cell 0: ")]
    assert len(first) == 6 + 1  # 3 rounds of 2 calls, then the closing line
    assert first[0].removeprefix("demo: cell 1/2 cell 0: ") in ("warm-up 1/1, a timed",
                                                               "warm-up 1/1, b timed")
    assert first[-2].endswith("round 2/2, a timed") or first[-2].endswith("round 2/2, b timed")
    assert first[-1] == "demo: cell 1/2 cell 0: 2 ok"
    assert sweep.cell_progress() is None  # only while a cell is measured


def test_progress_between_calls_is_throttled_and_off_without_progress(monkeypatch, capfd):
    monkeypatch.setenv(paths.HEADLESS_ENV, "1")
    monkeypatch.setattr(sweep, "PROGRESS_EVERY_S", 3600.0)

    def prepare(cell: sweep.Cell) -> sweep.CellPlan:
        told = sweep.cell_progress()
        return plan({"a": lambda r: None}, between_calls=told.call(cell) if told else None)

    sweep.run(cells(1), prepare, rounds=3, warmup=0, device="cpu", label="demo")
    assert capfd.readouterr().err.strip().splitlines() == ["demo: cell 1/1 cell 0: 1 ok"]
    sweep.run(cells(1), prepare, rounds=3, warmup=0, device="cpu", label="demo",
              progress=False)
    assert capfd.readouterr().err == ""


def test_lab_progress_without_ipywidgets_is_plain_text_on_stdout(monkeypatch, capsys):
    """Before: tqdm.auto without ipywidgets fell back to a text bar on stderr, which JupyterLab
    shows as a red error box; the bar is plain text on stdout now."""
    monkeypatch.delenv(paths.HEADLESS_ENV, raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ipywidgets" else real_find_spec(name, *a))
    sweep.run(cells(2), lambda cell: plan({"a": lambda r: None}), rounds=1, warmup=0,
              device="cpu", label="demo")
    out, err = capsys.readouterr()
    assert "demo" in out and "2/2" in out
    assert "demo" not in err


@pytest.mark.parametrize("event, host, agree", [(0.010, 0.0102, True), (0.010, 0.0125, False),
                                                (0.0001, 0.0005, True), (0.0001, 0.002, False)])
def test_host_clock_cross_check(event, host, agree):
    assert bench.clocks_agree(event, host) is agree


def test_a_pcie_sampler_that_fails_records_itself_unavailable(monkeypatch):
    class FailingNvml:
        NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_RX_BYTES = 0

        def nvmlInit(self): pass
        def nvmlShutdown(self): pass
        def nvmlDeviceGetHandleByIndex(self, index): return index

        def nvmlDeviceGetPcieThroughput(self, handle, counter):
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    monkeypatch.setitem(sys.modules, "pynvml", FailingNvml())
    with hardware.PcieSampler() as sampler:
        time.sleep(0.05)
    assert not sampler.available and sampler.samples == []
    assert "failed" in sampler.reason and "(RuntimeError: NVML_ERROR_GPU_IS_LOST)" in sampler.reason


def test_the_memory_plan_gives_the_estimate_and_refuses_before_anything_starts(monkeypatch):
    # Before: notebook 03's defaults needed 18.5 GiB and nothing said so before the cell started.
    from stagelab.measure import memory

    cell = sweep.Cell(sizes={}, arms=["a"], label="T=8193 V=152064", host_bytes=18 * 2**30)
    monkeypatch.setattr(memory, "free_host_bytes", lambda: 32 * 2**30)
    fits = sweep.memory_plan(cell, "cpu")
    assert fits.startswith("Memory: T=8193 V=152064 ") and "fits" in fits
    assert "18.0 GiB" in fits and "32.0 GiB" in fits and "Refused" not in fits
    monkeypatch.setattr(memory, "free_host_bytes", lambda: 8 * 2**30)
    refused = sweep.memory_plan(cell, "cpu")
    assert refused.startswith("**Refused") and "T=8193 V=152064 on the host" in refused
    assert "18.00 GiB" in refused and "8.00 GiB" in refused
    assert "recorded skipped" in refused
    monkeypatch.setattr(memory, "free_host_bytes", lambda: None)
    assert "cannot be read here" in sweep.memory_plan(cell, "cpu")


def test_the_watcher_is_called_between_the_rounds_of_every_cell():
    class Counting:
        def __init__(self) -> None:
            self.rounds = 0

        def admit(self, *args) -> bool:
            return True

        def finished(self, *args) -> None:
            pass

        def after_round(self) -> None:
            self.rounds += 1

    cells = [sweep.Cell(sizes={"rows": n}, arms=["a"], label=f"n={n}") for n in (1, 2)]
    with sweep.watching(Counting()) as watcher:
        sweep.run(cells, lambda cell: sweep.CellPlan(calls={"a": lambda r: None}), rounds=3,
                  warmup=1, device="cpu", progress=False)
    assert watcher.rounds == 2 * (1 + 3)
