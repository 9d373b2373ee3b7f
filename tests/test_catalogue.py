"""The catalogue names every arm once: each arm class or builder has an entry, each entry an arm,
and what the entries say (roles, stages, CUDA, notebooks) agrees with the code that measures."""

from __future__ import annotations

import pytest
import torch

from stagelab.core import catalogue, forward, paths, schema
from stagelab.core.errors import NativeUnavailable, PinnedMemoryUnavailable, UserError
from stagelab.measure import native, prompt_logprobs, shapes, staging, step, step_pipelines
from stagelab.run import params


def test_every_staging_arm_class_has_an_entry_and_every_entry_a_class():
    assert set(staging.arm_classes()) == set(catalogue.arm_names(catalogue.STAGING))
    assert tuple(staging.ARMS) == catalogue.arm_names(catalogue.STAGING)


def test_every_step_builder_has_an_entry_and_every_entry_a_builder():
    assert set(step_pipelines.BUILDERS) == set(catalogue.arm_names(catalogue.STEP))
    assert step_pipelines.STEP_ARMS == catalogue.arm_names(catalogue.STEP)


def test_prompt_methods_are_the_catalogues():
    assert prompt_logprobs.METHODS == catalogue.arm_names(catalogue.PROMPT)


@pytest.mark.parametrize("experiment", [catalogue.STAGING, catalogue.STEP, catalogue.PROMPT])
def test_each_experiment_has_one_baseline_and_one_candidate(experiment):
    assert catalogue.baseline(experiment) != catalogue.candidate(experiment)
    names = catalogue.arm_names(experiment)
    assert len(set(names)) == len(names)


def test_every_entry_is_well_formed():
    for arm in catalogue.ARMS:
        assert arm.role in catalogue.ROLES and arm.role != catalogue.AA_TWIN  # twins are derived
        assert arm.models and arm.experiment in {nb.experiment for nb in
                                                 catalogue.NOTEBOOKS.values()}
        assert set(arm.stages) <= set(catalogue.STAGES)
        assert not catalogue.is_twin(arm.name)


CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("name", catalogue.arm_names(catalogue.STAGING))
def test_a_staging_arm_needs_cuda_exactly_where_the_catalogue_says(name):
    if catalogue.arm(catalogue.STAGING, name).needs_cuda and not CUDA:
        with pytest.raises(PinnedMemoryUnavailable):
            staging.make_arm(name, 64)
    else:
        assert staging.make_arm(name, 64).name == name


@pytest.mark.parametrize("name", catalogue.arm_names(catalogue.STEP))
def test_a_step_arm_needs_cuda_exactly_where_the_catalogue_says(name):
    needs_cuda = catalogue.arm(catalogue.STEP, name).needs_cuda
    try:
        built = step_pipelines.make_pipeline(name)
    except PinnedMemoryUnavailable:
        assert needs_cuda and not CUDA
    except NativeUnavailable:
        pytest.skip("the native path cannot be built here")
    else:
        assert built.name == name and (CUDA or not needs_cuda)


def test_twin_names_resolve_to_their_arm():
    twin = catalogue.aa_name("seed_pageable")
    assert twin == "seed_pageable~aa" and catalogue.is_twin(twin)
    assert catalogue.arm(catalogue.STEP, twin).name == "seed_pageable"


def test_unknown_names_are_refused_naming_the_choices():
    with pytest.raises(ValueError, match="unknown step arm 'nope'; valid: seed_pageable, "):
        catalogue.arm(catalogue.STEP, "nope")
    with pytest.raises(ValueError, match="unknown experiment 'nope'"):
        catalogue.arms("nope")
    with pytest.raises(ValueError, match="unknown role 'nope'"):
        catalogue.with_role(catalogue.STEP, "nope")


def test_the_decisive_arms_are_the_steps_baseline_candidate_and_twin():
    assert catalogue.DECISIVE_EXPERIMENT == catalogue.STEP
    assert (catalogue.baseline(catalogue.STEP), catalogue.candidate(catalogue.STEP)) == (
        "seed_pageable", "seed_pinned")
    assert catalogue.DECISIVE_ROLES == (catalogue.BASELINE, catalogue.CANDIDATE,
                                        catalogue.AA_TWIN)
    assert catalogue.decisive_arms() == ("seed_pageable", "seed_pinned", "seed_pageable~aa")


def test_the_named_levers_are_arms_of_their_experiment():
    for experiment, name in catalogue.REUSE_LEVER.items():
        assert catalogue.arm(experiment, name).role == catalogue.LEVER
    assert catalogue.arm(catalogue.STAGING, catalogue.ZERO_FILL_LEVER).role == catalogue.LEVER
    assert catalogue.arm(catalogue.STEP, catalogue.NUMPY_TOP_K).role == catalogue.LEVER
    assert catalogue.PROMPT_RECOMMENDED_ARM == "fused+overlap"
    assert catalogue.prompt_arm("logsoftmax", overlap=False) == "logsoftmax"


def test_the_notebooks_are_the_catalogues_and_each_table_has_one_writer():
    assert set(catalogue.NOTEBOOKS) == {p.stem for p in paths.NOTEBOOKS_DIR.glob("*.ipynb")}
    assert catalogue.tables() == {"staging": "01_d2h_staging", "step": "02_logprobs_step",
                                  "prompt_logprobs": "03_prompt_logprobs"}
    for experiment in (catalogue.STAGING, catalogue.STEP, catalogue.PROMPT):
        assert catalogue.notebook_of(experiment).experiment == experiment


def test_arm_parameters_are_checked_against_the_catalogue():
    for notebook in ("01_d2h_staging", "02_logprobs_step"):
        experiment = catalogue.NOTEBOOKS[notebook].experiment
        arms = list(catalogue.arm_names(experiment))
        params.validate(notebook, {"arms": arms, "aa_arm": catalogue.baseline(experiment)})


def test_dtype_names_and_sizes_agree_with_torch():
    for name, size in catalogue.DTYPE_BYTES.items():
        assert shapes.DTYPES[name].itemsize == size


def test_rows_name_their_experiment_as_the_catalogue_does():
    shape = shapes.ModelShape("", 1000, 8)
    staging_cell, = staging.cells(staging.StagingSweep(
        [shape], [2], torch.float32, ["pageable_fresh"]), device="cpu")
    step_cell, = step.cells(step.StepSweep(
        [shape], [2], [1], torch.float32, ["fused"], aa_arm=None), device="cpu")
    prompt_cell = prompt_logprobs.prompt_cell(prompt_logprobs.PromptSweep(
        9, shape, 8, [4], torch.float32, 1, ["fused"], [False]), device="cpu")
    assert [c.sizes["experiment"] for c in (staging_cell, step_cell, prompt_cell)] == [
        catalogue.STAGING, catalogue.STEP, catalogue.PROMPT]


def test_without_a_list_of_arms_every_arm_of_the_catalogue_is_timed():
    shape = shapes.ModelShape("", 1000, 8)
    staging_cell, = staging.cells(staging.StagingSweep(
        [shape], [2], torch.float32, None), device="cpu")
    step_cell, = step.cells(step.StepSweep(
        [shape], [2], [1], torch.float32, None), device="cpu")
    assert staging_cell.arms == [*catalogue.arm_names(catalogue.STAGING), "pageable_fresh~aa"]
    assert step_cell.arms == [*catalogue.arm_names(catalogue.STEP), "seed_pageable~aa"]
    params.validate("01_d2h_staging", {"arms": None, "aa_arm": "raw_ceiling"})
    with pytest.raises(UserError, match="01_d2h_staging.aa_arm: unknown arm 'nope'"):
        params.validate("01_d2h_staging", {"arms": None, "aa_arm": "nope"})


def condition_faults(condition: catalogue.Condition) -> list[str]:
    """What a step condition's declaration lacks: a row column, words for each value, a rule
    for rows written before its column, a deciding value among its values."""
    faults = []
    if condition.column not in schema.COLUMNS or condition.column not in schema.ADDED_COLUMNS:
        faults.append(f"{condition.name}: column {condition.column!r} is not a row column added "
                      "after the first tables (core/schema.py)")
    if len(set(condition.values)) < 2 or condition.decides not in condition.values:
        faults.append(f"{condition.name}: needs two values or more, the deciding one among them")
    if set(condition.words) != set(condition.values) or not all(condition.words.values()):
        faults.append(f"{condition.name}: needs words for each value")
    if condition.old_rows not in condition.values:
        faults.append(f"{condition.name}: needs a value for rows written before its column")
    return faults


@pytest.mark.parametrize("condition", catalogue.CONDITIONS, ids=lambda c: c.name)
def test_every_step_condition_has_a_column_words_and_an_old_row_rule(condition):
    assert condition_faults(condition) == []
    assert catalogue.condition(condition.name) is condition
    assert condition.reads(None) == condition.reads(float("nan")) == condition.old_rows
    assert [condition.reads(value) for value in condition.values] == list(condition.values)


def test_a_condition_without_a_column_words_or_an_old_row_rule_is_found():
    broken = catalogue.Condition("thp", "thp_mode", ("always", "never"), "always",
                                 {"always": "THP always"}, old_rows="")
    faults = " ".join(condition_faults(broken))
    assert "column 'thp_mode'" in faults and "words" in faults and "rows written before" in faults


def test_the_measuring_code_takes_each_conditions_values_from_the_catalogue():
    assert step_pipelines.LOG_SOFTMAX == catalogue.LOG_SOFTMAX.values
    assert (native.MALLOC, native.MAPPED) == catalogue.ALLOCATOR.values
    assert forward.OVERLAP_ORDERS == catalogue.OVERLAP.values
    with pytest.raises(ValueError, match="known: log_softmax, allocator, overlap"):
        catalogue.condition("thp")


def test_a_recorded_value_reads_by_the_conditions_rule():
    """The allocator's rows name the process's malloc (glibc, jemalloc): they read as malloc;
    another condition's unknown value (a stranger's) is none of its values."""
    assert catalogue.ALLOCATOR.reads("jemalloc") == catalogue.MALLOC
    assert catalogue.ALLOCATOR.reads(catalogue.MAPPED_FRESH) == catalogue.MAPPED_FRESH
    assert catalogue.OVERLAP.reads("sideways") is None
