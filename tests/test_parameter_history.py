"""Parameters recorded by older runs are read in today's shape (core/parameter_history.py), by
every reader of recorded parameters: keep's re-derivation, the replay, the runs listing."""

from __future__ import annotations

from pathlib import Path

from stagelab.core import catalogue, parameter_history, paths
from stagelab.measure import experiments
from stagelab.present import rederive
from stagelab.run import profiles, replay
from stagelab.run.profiles import NotebookPlan

STEP, VERDICT = parameter_history.STEP_NOTEBOOK, parameter_history.VERDICT_NOTEBOOK
DECIDES = {c.name: c.decides for c in catalogue.CONDITIONS}
# As runs of 2026-12-02 to 2026-12-05 recorded them (one parameter per condition).
OLD_STEP = {"rounds": 3, "log_softmax": ["device", "host"], "seed_regimes": ["malloc"],
            "overlap_orders": ["queued", "waited"], "overlap_only": [[16, "Qwen2.5-7B"]]}
OLD_VERDICT = {"delta": 0.05, "log_softmax": "host", "overlap_order": "waited"}


def test_an_old_step_record_reads_as_one_conditions_mapping_and_its_cells():
    found = parameter_history.current(STEP, OLD_STEP)
    assert found == {"rounds": 3,
                     "conditions": {"log_softmax": ["device", "host"], "allocator": ["malloc"],
                                    "overlap": ["queued", "waited"]},
                     "condition_cells": {"overlap": [[16, "Qwen2.5-7B"]]}}
    assert parameter_history.is_old(STEP, OLD_STEP) and not parameter_history.is_old(STEP, found)
    assert parameter_history.current(STEP, found) == found  # today's shape reads as it stands


def test_an_old_verdict_record_reads_each_decided_value_by_condition_name():
    found = parameter_history.current(VERDICT, OLD_VERDICT)
    assert found == {"delta": 0.05, "conditions": {**DECIDES, "log_softmax": "host",
                                                   "overlap": "waited"}}


def test_a_record_from_before_any_condition_and_other_notebooks_are_kept_as_recorded():
    assert parameter_history.current(STEP, {"rounds": 2}) == {"rounds": 2}
    staging = catalogue.notebook_of(catalogue.STAGING).name
    assert parameter_history.current(staging, {"log_softmax": "x"}) == {"log_softmax": "x"}
    partial = parameter_history.current(VERDICT, {"conditions": {"overlap": "waited"}})
    assert partial["conditions"] == {**DECIDES, "overlap": "waited"}  # every condition named


def test_todays_value_wins_over_an_older_one_for_the_same_condition():
    both = {"log_softmax": "host", "conditions": {"log_softmax": "device"}}
    assert parameter_history.current(VERDICT, both)["conditions"]["log_softmax"] == "device"


def test_the_history_comment_names_every_older_parameter():
    older = {*parameter_history.OLD_CONDITION_CELLS,
             *(name for names in parameter_history.OLD_CONDITIONS.values() for name in names)}
    assert older == {"log_softmax", "seed_regimes", "overlap_orders", "overlap_only",
                     "overlap_order"}
    assert all(f"``{name}``" in (parameter_history.__doc__ or "") for name in older)


def test_an_old_step_record_measures_the_cells_todays_parameters_do():
    smoke = profiles.profile_parameters("smoke")[STEP]
    today = {**smoke, "conditions": {"overlap": ["queued", "waited"]}, "condition_cells": None}
    old = {key: value for key, value in smoke.items()
           if key not in ("conditions", "condition_cells")}
    old.update(overlap_orders=["queued", "waited"], log_softmax=["device"])
    bound = experiments.EXPERIMENTS[catalogue.STEP]
    read = bound.cells(parameter_history.current(STEP, old), "cpu")
    assert [c.sizes for c in read] == [c.sizes for c in bound.cells(today, "cpu")]
    assert {c.sizes["overlap_order"] for c in read} == {"queued", "waited"}


def test_keep_reads_an_old_verdict_record_and_finds_no_change_where_it_matches_the_profile():
    smoke = profiles.load_profiles()["smoke"]["notebooks"][VERDICT]
    manifest = {"profile": "smoke", "notebooks": [{"name": VERDICT, "parameters": {
        **smoke, "log_softmax": "device", "overlap_order": "queued"}}]}
    recorded = rederive.recorded_parameters(manifest)
    assert recorded["conditions"] == DECIDES
    assert not {"log_softmax", "overlap_order"} & set(recorded)
    assert rederive.decision_changes(manifest) == []
    manifest["notebooks"][0]["parameters"] = {**smoke, "overlap_order": "waited"}
    assert rederive.decision_changes(manifest) == [
        f"conditions {({**DECIDES, 'overlap': 'waited'})!r} (profile smoke: {DECIDES!r})"]
    step = rederive.recorded_notebook_parameters(
        {"notebooks": [{"name": STEP, "parameters": OLD_STEP}]}, STEP)
    assert step["condition_cells"] == {"overlap": [[16, "Qwen2.5-7B"]]}
    assert "overlap_orders" not in step


def test_a_replay_accepts_an_old_measured_record_in_todays_names():
    plan = NotebookPlan(STEP, paths.NOTEBOOKS_DIR / f"{STEP}.ipynb")
    given = replay.measured_parameters(plan, {"parameters": OLD_STEP}, Path("node"))
    assert given["conditions"]["overlap"] == ["queued", "waited"]
    assert given["condition_cells"] == {"overlap": [[16, "Qwen2.5-7B"]]}
