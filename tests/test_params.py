"""Bad parameter values of the real notebooks are bad requests: exit 2, one line naming the
parameter, and no run folder; good values pass, and arm names come from their registries."""

from __future__ import annotations

import pytest

from stagelab import cli
from stagelab.core import catalogue
from stagelab.core.errors import UserError
from stagelab.run import params, profiles

BAD = [
    # Before: exit 1 and a failed run folder.
    ("01_d2h_staging.rows=[0]", "01_d2h_staging.rows: 0 is not a positive integer"),
    ("01_d2h_staging.rounds=0", "01_d2h_staging.rounds: 0 is not a positive integer"),
    ("01_d2h_staging.models=[Nope-7B]", "01_d2h_staging.models: unknown model 'Nope-7B'; known: "),
    # Before: a TypeError that named no parameter.
    ("01_d2h_staging.models=null", "01_d2h_staging.models is null (None); give a list"),
    # Before: "arms is empty".
    ("03_prompt_logprobs.overlaps=[]", "03_prompt_logprobs.overlaps: [] is empty"),
    # Before: "is a str".
    ("01_d2h_staging.rounds=1e9", "01_d2h_staging.rounds=1000000000.0 is a float, expected int "
                                  "(default 12); write 1000000000"),
    ("01_d2h_staging.rows=[1e3]", "01_d2h_staging.rows: 1000.0 is not a positive integer; "
                                  "write [1000]"),
    ("01_d2h_staging.rounds=\"20\"", "01_d2h_staging.rounds='20' is a str, expected int"),
    ("01_d2h_staging.models=[Qwen2.5-7B, {]", "01_d2h_staging.models=[Qwen2.5-7B, {]': not valid JSON"),
    ("01_d2h_staging.arms=[pageable_fresh, nope]", "01_d2h_staging.arms: unknown arm 'nope'"),
    ("01_d2h_staging.arms=[pinned_grow_only, raw_ceiling]",
     "01_d2h_staging.aa_arm: 'pageable_fresh' must be in arms"),
    ("01_d2h_staging.aa_arm=nope", "01_d2h_staging.aa_arm: unknown arm 'nope'"),
    ("01_d2h_staging.arms=[raw_ceiling, raw_ceiling]", "names an arm twice"),
    ("01_d2h_staging.dtype=float64", "01_d2h_staging.dtype: unknown dtype 'float64'; valid: "),
    ("02_logprobs_step.arms=[pageable_fresh]", "02_logprobs_step.arms: unknown step arm"),
    ("02_logprobs_step.ks=[-1]", "02_logprobs_step.ks: -1 is not an integer >= 0"),
    ("02_logprobs_step.logits_dtype=int8", "02_logprobs_step.logits_dtype: unknown dtype"),
    ("03_prompt_logprobs.methods=[softmax]", "03_prompt_logprobs.methods: unknown method"),
    ("03_prompt_logprobs.tokens=1", "03_prompt_logprobs.tokens: 1 is not an integer >= 2"),
    ("03_prompt_logprobs.model=Nope", "03_prompt_logprobs.model: unknown model 'Nope'"),
    ("03_prompt_logprobs.overlaps=[yes-please]", "'yes-please' is not true or false"),
    ("04_verdict.confidence=1.5", "04_verdict.confidence: 1.5 is not in (0.0, 1.0)"),
    ("04_verdict.min_samples=-3", "04_verdict.min_samples: -3 is not a positive integer"),
    ("04_verdict.delta=0", "04_verdict.delta: 0 is not in (0.0, 1.0)"),
    ("04_verdict.decisive_models=[Nope-7B]", "04_verdict.decisive_models: unknown model"),
    ("04_verdict.decisive_rows=[]", "04_verdict.decisive_rows: [] is empty"),
    ("02_logprobs_step.arms=[fused]", "02_logprobs_step.aa_arm: 'seed_pageable' must be in arms"),
    ("01_d2h_staging.run_dir=/tmp/elsewhere", "01_d2h_staging.run_dir is set by the runner"),
    # Before: passed the checks, then failed notebooks 02 and 04 (one cell measured twice).
    ("02_logprobs_step.rows=[16, 16]", "02_logprobs_step.rows: [16, 16] names the same rows twice"),
    ("04_verdict.decisive_rows=[64, 64]", "04_verdict.decisive_rows: [64, 64] names the same rows"),
    ("02_logprobs_step.models=[Qwen2.5-7B, Qwen2.5-7B]", "names the same vocabulary twice"),
    ("04_verdict.decisive_models=[Qwen2.5-7B, 152064]",
     "names the same vocabulary twice ('Qwen2.5-7B' and 152064)"),
    ("02_logprobs_step.ks=[5, 5]", "02_logprobs_step.ks: [5, 5] names the same K twice"),
    ("03_prompt_logprobs.chunks=[128, 128]", "names the same chunk twice"),
    ("02_logprobs_step.forward_ms=-1", "02_logprobs_step.forward_ms: -1 is not a number of "
                                       "milliseconds >= 0"),
    ('02_logprobs_step.conditions={"log_softmax": ["gpu"]}',
     "02_logprobs_step.conditions: unknown log_softmax value 'gpu'; valid: device, host"),
    ('02_logprobs_step.conditions={"log_softmax": ["host", "host"]}',
     "names the same log_softmax value twice"),
    ('02_logprobs_step.conditions={"thp": ["never"]}',
     "02_logprobs_step.conditions: unknown step condition 'thp'"),
    ('02_logprobs_step.conditions=["queued"]', "02_logprobs_step.conditions=['queued'] is a list"),
    ("02_logprobs_step.max_rounds=5", "02_logprobs_step.max_rounds: 5 is below rounds (12)"),
    ("02_logprobs_step.max_seconds=0", "02_logprobs_step.max_seconds: 0 is not a positive"),
    ('04_verdict.conditions={"log_softmax": "gpu"}',
     "04_verdict.conditions: unknown log_softmax value 'gpu'"),
    ('02_logprobs_step.conditions={"overlap": ["after"]}',
     "02_logprobs_step.conditions: unknown overlap value 'after'; valid: queued, waited"),
    ('02_logprobs_step.conditions={"overlap": ["waited", "waited"]}',
     "names the same overlap value twice"),
    ('02_logprobs_step.condition_cells={"overlap": [[16]]}',
     "02_logprobs_step.condition_cells: [16] is not a pair"),
    ('02_logprobs_step.condition_cells={"overlap": [[16, "Nope-7B"]]}',
     "condition_cells: unknown model 'Nope-7B'"),
    ('04_verdict.conditions={"overlap": "after"}',
     "04_verdict.conditions: unknown overlap value 'after'"),
    # Before: a top-K above the vocabulary passed the checks, then failed inside the run.
    ("02_logprobs_step.ks=[5, 200000]", "02_logprobs_step.ks: top-K 200000 exceeds the "
                                        "vocabulary of Qwen2.5-7B (152064); K can be at most V"),
    ("03_prompt_logprobs.vocab=4", "03_prompt_logprobs.k: top-K 5 exceeds the vocabulary of 4"),
    ("04_verdict.decisive_ks=[300000]", "04_verdict.decisive_ks: top-K 300000 exceeds"),
]


@pytest.mark.parametrize("param, message", BAD, ids=[p for p, _ in BAD])
def test_a_bad_value_is_a_bad_request(tmp_path, capsys, param, message):
    code = cli.main(["run", "--profile", "quick", "--param", param, "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_USAGE, err
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # refused before any run folder exists


def test_a_param_for_a_notebook_left_out_by_only_is_refused(tmp_path, capsys):
    # Before: silently ignored.
    code = cli.main(["run", "--only", "00_environment", "--param", "01_d2h_staging.rounds=3",
                     "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_USAGE
    assert "--param for 01_d2h_staging" in err and "--only" in err


GOOD = {
    "01_d2h_staging": {"models": ["GPT-2", 1000], "rows": [1], "arms": ["pageable_fresh",
                                                                       "raw_ceiling"],
                       "rounds": 1, "warmup": 0, "dtype": "bfloat16"},
    "02_logprobs_step": {"ks": [0], "arms": ["seed_pageable", "fused"], "logits_dtype": "float16",
                         "conditions": {"overlap": ["waited", "queued"]},
                         "condition_cells": {"overlap": [[16, "Qwen2.5-7B"], [64, 152064]]}},
    "03_prompt_logprobs": {"tokens": 2, "overlaps": [False], "methods": ["fused"], "vocab": 0},
    "04_verdict": {"confidence": 0.9, "delta": 0.05, "decisive_models": ["GPT-2", 1000]},
}


def test_good_values_pass():  # the negative control of the table above
    plan = profiles.plan_run("quick", overrides=GOOD)
    by_name = {nb.name: nb.parameters for nb in plan.notebooks}
    assert by_name["01_d2h_staging"]["arms"] == ["pageable_fresh", "raw_ceiling"]
    assert by_name["03_prompt_logprobs"]["overlaps"] == [False]


def test_every_shipped_profile_passes_the_checks():
    for name in profiles.load_profiles():
        assert profiles.plan_run(name).notebooks


def test_arm_names_come_from_the_catalogue(monkeypatch):
    new_arm = catalogue.Arm("brand_new_arm", catalogue.STAGING, catalogue.LEVER, "a test arm")
    monkeypatch.setattr(catalogue, "ARMS", (*catalogue.ARMS, new_arm))
    params.validate("01_d2h_staging", {"arms": ["brand_new_arm"], "aa_arm": "brand_new_arm"})
    only = catalogue.Arm("only_this", catalogue.STEP, catalogue.BASELINE, "the one step arm")
    monkeypatch.setattr(catalogue, "ARMS", (only,))
    with pytest.raises(UserError, match="unknown step arm 'fused'; valid: only_this"):
        params.validate("02_logprobs_step", {"arms": ["fused"]})


def test_a_computed_default_is_left_to_the_notebook():
    params.validate("01_d2h_staging", {"rows": None})  # not chosen: the notebook computes it
    with pytest.raises(UserError, match="01_d2h_staging.rows"):
        params.validate("01_d2h_staging", {"rows": None}, chosen=["rows"])


@pytest.mark.parametrize("value, hint", [
    (1e9, "; for a whole number write 1000000000"), (1000.0, "; for a whole number write 1000"),
    ("1e9", ""), ("many", ""), (3, ""), (0.5, ""),
])
def test_number_hints(value, hint):
    assert params.number_hint(value) == hint


@pytest.mark.parametrize("text, value", [
    ("20", 20), ("1e3", 1000.0), ("[16, 64]", [16, 64]), ("true", True), ("null", None),
    ('"1e9"', "1e9"), ("Qwen2.5-7B", "Qwen2.5-7B"), ("[Qwen2.5-7B, 4096]", ["Qwen2.5-7B", 4096]),
    ("[]", []), ("[ ]", []), ("[yes-please]", ["yes-please"]),
])
def test_param_values_are_json_with_bare_words_as_text(text, value):
    assert profiles.parse_value(text) == value


@pytest.mark.parametrize("given", [
    "01_d2h_staging.rows=1e9", "01_d2h_staging.rows=1000000000", "01_d2h_staging.rows=[1e3]",
    "01_d2h_staging.rounds=1e9", "02_logprobs_step.ks=5", "02_logprobs_step.ks=[1e1]",
    "03_prompt_logprobs.chunks=64", "04_verdict.decisive_rows=16.0",
])
def test_every_suggested_value_is_accepted(given):
    # Before: rows=1e9 was refused with "write 1000000000", which was refused in turn.
    with pytest.raises(UserError) as refused:
        profiles.plan_run("quick", overrides=profiles.parse_overrides([given]))
    suggested = str(refused.value).rpartition("write ")[2]
    assert suggested and suggested != str(refused.value)
    key = given.partition("=")[0]
    profiles.plan_run("quick", overrides=profiles.parse_overrides([f"{key}={suggested}"]))


@pytest.mark.parametrize("given", ["02_logprobs_step.ks=1e9", "02_logprobs_step.ks=[1e9]",
                                   "01_d2h_staging.rounds=2.5"])
def test_no_suggestion_where_no_value_near_would_be_accepted(given):
    with pytest.raises(UserError) as refused:
        profiles.plan_run("quick", overrides=profiles.parse_overrides([given]))
    assert "write" not in str(refused.value)  # a top-K above every vocabulary; a fraction


def test_the_quick_profile_times_a_chunk_of_512_or_more_shorter_than_its_prompt():
    """Before: quick's 513-token prompt (512 rows) was timed at chunks 64 and 256 only, so the
    chunk sizes that matter were never measured and a chunk was recommended without them."""
    prompt = profiles.profile_parameters("quick")["03_prompt_logprobs"]
    rows = prompt["tokens"] - 1
    assert [c for c in prompt["chunks"] if 512 <= c < rows], (prompt["chunks"], rows)
