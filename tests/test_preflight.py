"""`stagelab preflight`: the CPU outcome (no-go, exit 3, reasons written), bad input, the memory
model of a profile's largest cell, and how checks are judged."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from stagelab import cli
from stagelab.measure import memory, preflight, prompt_logprobs
from stagelab.measure.preflight import GO, INFO, NO_GO, UNAVAILABLE, Check
from stagelab.run import profiles

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU outcome needs no CUDA")


@no_cuda
def test_cpu_preflight_is_no_go_and_writes_the_reasons(tmp_path, capsys):
    out = tmp_path / "pf" / "preflight.json"
    assert cli.main(["preflight", "--profile", "quick", "--out", str(out)]) == 3
    printed = capsys.readouterr()
    table = printed.out.splitlines()
    assert table[0].split() == ["check", "status", "detail"]
    assert any(line.split()[:2] == ["cuda", "no-go"] for line in table)
    assert "NO-GO (exit 3)" in printed.out
    assert "blocking: cuda: no CUDA device" in printed.err
    assert "what can still run here" in printed.err and "pinned arms" in printed.err

    saved = json.loads(out.read_text())
    assert saved["decision"] == "no-go" and saved["exit_status"] == 3
    assert saved["profile"] == "quick" and len(saved["blocking"]) == 1
    assert "pinned" in saved["blocking"][0] and "staging" in saved["blocking"][0]
    by_name = {c["name"]: c for c in saved["checks"]}
    for name in ("pinned_copy", "host_register", "event_timing", "sync_debug"):
        assert by_name[name]["status"] == "unavailable", name
        assert "CUDA device" in by_name[name]["detail"], name
    assert by_name["memory"]["status"] == "go"
    assert {c["notebook"] for c in by_name["memory"]["data"]["cells"]} == {
        "01_d2h_staging", "02_logprobs_step", "03_prompt_logprobs"}
    assert by_name["cpu_features"]["data"]["torch_cpu_capability"]
    assert by_name["native"]["status"] in ("go", "unavailable")
    assert [line.split()[0] for line in table[2:len(saved["checks"]) + 2]] == list(by_name)


def test_unknown_profile_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "never" / "preflight.json"
    assert cli.main(["preflight", "--profile", "nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stagelab: error:") and "'nope'" in err[0]
    assert "quick" in err[0]
    assert not (tmp_path / "never").exists()


def test_an_out_path_that_cannot_be_made_is_refused_before_any_check(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(preflight.UserError, match="--out"):
        preflight.resolve_out(blocker / "sub")
    assert preflight.resolve_out(tmp_path / "folder") == tmp_path / "folder" / "preflight.json"
    assert preflight.resolve_out(tmp_path / "x.json") == tmp_path / "x.json"


def test_profile_parameters_are_the_notebook_defaults_then_the_profile():
    params = profiles.profile_parameters("quick")
    assert params["03_prompt_logprobs"]["tokens"] == 769  # the profile's
    assert params["03_prompt_logprobs"]["k"] == 5  # the notebook's default
    assert params["01_d2h_staging"]["sources"] == 3


STAGING = {"models": [1000, 4096], "rows": [2, 8], "dtype": "float32", "sources": 3,
           "arms": ["pageable_fresh", "raw_ceiling"], "aa_arm": "pageable_fresh"}
STEP = {"models": [1000], "rows": [4], "ks": [5], "logits_dtype": "bfloat16", "sources": 2,
        "arms": ["seed_pageable", "fused"], "aa_arm": "seed_pageable"}
PROMPT = {"model": "GPT-2", "vocab": 1000, "hidden": 8, "tokens": 97, "k": 2, "chunks": [16],
          "dtype": "float32", "methods": ["fused", "logsoftmax"], "overlaps": [True]}


def test_the_largest_cells_are_the_sweeps_own_on_the_cpu():
    staging, step, prompt = preflight.largest_cells(
        {"00_environment": {}, "01_d2h_staging": STAGING, "02_logprobs_step": STEP,
         "03_prompt_logprobs": PROMPT}, device="cpu")
    cell = 8 * 4096 * 4  # on a CPU the sources live on the host too: 3 arms + 1 + 3 sources
    assert (staging.cell, staging.device_bytes, staging.host_bytes) == ("n=8 V=4096", 0, 7 * cell)
    assert (step.cell, step.device_bytes) == ("n=4 V=1000 K=5 log-softmax on device", 0)
    assert step.host_bytes == 3 * 4 * 1000 * 4 + 4 * 1000 * (2 * 2 + 12)
    peak = prompt_logprobs.predicted_peak_bytes(tokens=97, vocab=1000, chunk=96,
                                                dtype=torch.float32, method="logsoftmax",
                                                num_logprobs=2)
    assert prompt.cell == "T=97 V=1000 H=8" and prompt.host_bytes == (97 + 1000) * 8 * 4 + peak


def test_memory_is_no_go_when_the_largest_cell_does_not_fit(monkeypatch):
    needs = preflight.largest_cells({"01_d2h_staging": STAGING})
    on_host = needs[0].device_bytes + needs[0].host_bytes
    monkeypatch.setattr(memory, "free_host_bytes", lambda: on_host)  # 90 % of it is too little
    short = preflight.check_memory(needs, on_gpu=False)
    assert short.status == NO_GO and "DOES NOT FIT" in short.detail
    assert "01_d2h_staging n=8 V=4096" in short.detail
    monkeypatch.setattr(memory, "free_host_bytes", lambda: 2 * on_host)
    assert preflight.check_memory(needs, on_gpu=False).status == GO


def test_a_check_that_raises_is_recorded_not_fatal():
    def broken() -> Check:
        raise RuntimeError("driver said no\nsecond line")

    assert preflight._guarded("x", broken, blocking=True)[0].status == NO_GO
    row = preflight._guarded("x", broken, blocking=False)[0]
    assert (row.status, row.detail) == (UNAVAILABLE, "RuntimeError: driver said no")
    checks = [Check("a", GO, "fine"), Check("b", NO_GO, "why"), Check("c", INFO, "fact")]
    assert preflight.blocking_reasons(checks) == ["b: why"]


def test_native_status_is_read_and_blocks_only_a_profile_with_the_step(monkeypatch):
    fake = types.SimpleNamespace(status=lambda: (False, "no C++ compiler (g++ not found)"))
    monkeypatch.setitem(sys.modules, "stagelab.measure.native", fake)
    monkeypatch.setattr("stagelab.measure.native", fake, raising=False)
    failed = preflight.check_native()
    assert failed.status == UNAVAILABLE and failed.detail.startswith("no C++ compiler")
    blocked = preflight.check_native(decisive=True)
    assert blocked.status == NO_GO and "step A/B's decisive arms" in blocked.detail
    assert "no C++ compiler" in preflight.blocking_reasons([blocked])[0]
    fake.status = lambda: (True, "built with g++ 12")
    assert preflight.check_native(decisive=True).status == GO


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_gpu_preflight_runs_every_check(tmp_path: Path):
    status = preflight.preflight("quick", profiles.profile_parameters("quick"), tmp_path)
    saved = json.loads((tmp_path / "preflight.json").read_text())
    names = [c["name"] for c in saved["checks"]]
    assert {"sync:logprobs_from_logits", "sync:gather_logprobs(compute_logprobs)",
            "sync:prompt_logprobs"} <= set(names)
    assert status == (0 if saved["decision"] == "go" else 3)


def test_the_help_states_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        cli.main(["preflight", "--help"])
    assert "0 go, 3 no-go" in " ".join(capsys.readouterr().out.split())


def test_every_decisive_check_is_a_check_the_preflight_makes():
    """Before: ``DECISIVE_CHECKS`` named ``pinned`` while the check is ``pinned_copy``, so a
    failing pinned copy was never decisive."""
    made = {check.name for check in preflight.run_checks({})}
    assert set(preflight.DECISIVE_CHECKS) <= made
    assert preflight.PINNED_CHECK in preflight.DECISIVE_CHECKS


def test_force_cannot_pass_a_failing_pinned_copy(monkeypatch, tmp_path):
    """A node with CUDA whose pinned copy fails: its no-go is decisive, and neither ``--force``
    nor the lack of it measures a profile that decides."""
    from stagelab.run import measure_command

    monkeypatch.setattr(preflight, "check_cuda", lambda: Check("cuda", GO, "a fake GPU"))
    monkeypatch.setattr(preflight, "check_pinned",
                        lambda: Check(preflight.PINNED_CHECK, NO_GO, "MISMATCH"))
    for name in ("check_host_register", "check_event_timing", "check_nvml"):
        monkeypatch.setattr(preflight, name, lambda n=name: Check(n, GO, "fake"))
    monkeypatch.setattr(preflight, "check_sync_debug", lambda: [])
    checks = preflight.run_checks({})
    decisive = preflight.decisive_reasons(checks)
    assert decisive == [f"{preflight.PINNED_CHECK}: MISMATCH"]
    forced = measure_command.Request("gate", {}, {}, tmp_path, force=True, decides=True)
    assert measure_command.refused_no_go(forced, preflight.blocking_reasons(checks),
                                         decisive) is not None


def test_what_tritons_first_launch_needs_is_named_when_missing(tmp_path, monkeypatch):
    """Before: nothing checked that a node can build Triton's launcher (a C compiler, Python.h,
    libcuda.so.1); its first launch would fail the one-pass arms on the lease."""
    monkeypatch.delenv("CC", raising=False)
    header = tmp_path / "Python.h"

    def no_driver(name):
        raise OSError(f"{name}: cannot open shared object file")

    missing = preflight.triton_launch_missing(which=lambda name: None, python_h=header,
                                              load=no_driver)
    assert [m.split(" (")[0] for m in missing] == ["a C compiler", "Python.h", "libcuda.so.1"]
    header.write_text("")
    found = preflight.triton_launch_missing(which=lambda name: f"/usr/bin/{name}",
                                            python_h=header, load=lambda name: object())
    assert found == []
    monkeypatch.setenv("CC", "cc")
    assert preflight.triton_launch_missing(which=lambda name: None, python_h=header,
                                           load=lambda name: object()) == []


def test_the_preflight_says_whether_triton_can_launch(monkeypatch):
    monkeypatch.setattr(preflight, "triton_launch_missing", lambda: ["libcuda.so.1 (x)"])
    check = preflight.check_triton_launch()
    assert check.status in (preflight.UNAVAILABLE, preflight.INFO)
    if check.status == preflight.UNAVAILABLE:
        assert check.data["missing"] == ["libcuda.so.1 (x)"] and "libcuda" in check.detail
    assert "triton_launch" in {c.name for c in preflight.run_checks({})}
