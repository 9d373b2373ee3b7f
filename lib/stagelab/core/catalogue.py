"""The suite's vocabulary, named once: every arm with its role, the notebooks with their experiment
and table, the stages of a step, and the roles that decide.

Standard library only (the ground floor): the run plan, the preflight, the analysis, the verdict,
the comparison and the report read names from here without loading the measuring code. The
measuring modules build their registries from it too, so adding an arm is its class (or builder)
plus one :class:`Arm` entry below; ``tests/test_catalogue.py`` fails when either is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---------------------------------------------------------------------------------- roles

BASELINE = "baseline"  # what the engine does today
CANDIDATE = "candidate"  # the proposed change
AA_TWIN = "A/A twin"  # the baseline timed again as if it were another arm: the harness check
LEVER = "lever"  # one part of the change, or an alternative, measured apart; never decides
CEILING = "ceiling"  # no strategy at all: the best this machine does
ROLES = (BASELINE, CANDIDATE, AA_TWIN, LEVER, CEILING)
DECISIVE_ROLES = (BASELINE, CANDIDATE, AA_TWIN)  # the arms the verdict decides from

AA_SUFFIX = "~aa"


def aa_name(arm: str) -> str:
    """The name of an arm's A/A twin: the same arm timed again as if it were another."""
    return f"{arm}{AA_SUFFIX}"


def is_twin(arm: str) -> bool:
    """Whether an arm name is an A/A twin's."""
    return arm.endswith(AA_SUFFIX)


def arm_words(arm: str) -> str:
    """An arm as a legend names it: its catalogue name, an A/A twin said in words."""
    return f"{arm.removesuffix(AA_SUFFIX)} (A/A twin)" if is_twin(arm) else arm


def log_softmax_place(place: str, on_cpu: bool) -> str:
    """Where the log-softmax ran, in words: on a CPU run the 'device' is the host's own
    processor, and the two places differ only in the copy's side (before: both read "host",
    beside a note that the host place was not measured)."""
    if not on_cpu:
        return place
    side = "before" if place == DEVICE else "after"
    return f"CPU, {side} the copy (a CPU run: the device is the host's own processor)"


# ------------------------------------------------------------------------------- experiments

STAGING, STEP, PROMPT = "staging", "step", "prompt_logprobs"
EXPERIMENTS = (STAGING, STEP, PROMPT)  # in the order a run measures them
DECISIVE_EXPERIMENT = STEP  # the seed's own step decides; the copy level explains the mechanism

# The stages of a step, in the order a step runs them; every timing also has a whole-call row.
STAGES = ("device", "alloc", "copy", "host_gather", "free")
TOTAL = "total"
# Each part of a step in words: one name per stage in every table, legend, sentence and progress
# line (the "device" stage is the log-softmax, wherever it runs; "alloc" the seed's zero-fill).
STAGE_WORDS = {"forward": "forward", "device": "log-softmax", "alloc": "zero-fill",
               "copy": "copy", "host_gather": "host top-K", "free": "free",
               "unattributed": "unattributed", TOTAL: "total",
               "wait": "wait", "host_softmax": "host log-softmax"}
# A step's timeline (notebook 02): each arm's short sequence and each of its stages is a range
# of these names in the Chrome trace (measure/timeline.py writes them, analyse/timeline.py reads).
TIMELINE_ARM_PREFIX, TIMELINE_STAGE_PREFIX = "stagelab.arm:", "stagelab.stage:"
TIMELINE_TABLE = "step_timeline"  # the trace's name in the run folder: data/<it>.trace.json.gz
SEED_STAGES = STAGES  # the seed's step: the whole [n, V] fp32 logprobs staged on the host
DEVICE_STAGES = ("device", "copy")  # top-K on the device: only [n, K+1] results are copied

# What an arm's host buffer is per call, for the estimate's copy rate (measure/estimate.py).
FRESH, REUSED, PINNED = "fresh", "reused", "pinned"
# Which host top-K a step arm runs after its copy ("" where the top-K runs on the device).
NATIVE_TOP_K, NUMPY_TOP_K_BACKEND = "native", "numpy"

# Element types the suite measures, by name, with their size in bytes.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Arm:
    """One measured variant: its name, experiment and role, what it models, whether it needs a
    CUDA device to exist, the stages it times (empty: only the whole call), and what its cost
    is made of: the host buffer it copies into per call and the host top-K it runs."""

    name: str
    experiment: str
    role: str
    models: str
    needs_cuda: bool = False
    stages: tuple[str, ...] = ()
    buffer: str = FRESH
    host_top_k: str = ""

    @property
    def stages_whole_logprobs(self) -> bool:
        """Whether it copies the whole ``[n, V]`` fp32 logprobs to the host (the seed's way)."""
        return "host_gather" in self.stages


ARMS = (
    # copy level (notebook 01): the mechanism, one staging strategy per arm
    Arm("pageable_fresh", STAGING, BASELINE,
        "the seed's per-step std::vector (native, value-initialised on one thread): a new "
        "zero-filled pageable buffer, freed in the call"),
    Arm("pageable_fresh_zeros", STAGING, LEVER,
        "a new zero-filled pageable buffer through torch.zeros (filled on several threads): the "
        "first copy-level baseline, too cheap on a many-core host; labelled, never the baseline"),
    Arm("pageable_fresh_empty", STAGING, LEVER,
        "a new uninitialised pageable buffer (torch.empty): zero-fill's cost by difference"),
    Arm("pageable_reused", STAGING, LEVER,
        "one grow-only pageable buffer: the reuse lever alone", buffer=REUSED),
    Arm("pinned_grow_only", STAGING, CANDIDATE,
        "one grow-only pinned scratch: reuse and pinning (the proposal)", needs_cuda=True,
        buffer=PINNED),
    Arm("pinned_fresh", STAGING, LEVER,
        "fresh memory pinned every copy (cudaHostRegister): what pinning itself costs",
        needs_cuda=True),
    Arm("to_cpu_non_blocking", STAGING, LEVER,
        "torch's caching pinned allocator with an event wait (vLLM, SGLang)", needs_cuda=True),
    Arm("raw_ceiling", STAGING, CEILING,
        "copy_ into one preallocated buffer, pinned where CUDA exists: the reference ceiling",
        buffer=PINNED),
    # the whole step (notebook 02): the decision
    Arm("seed_pageable", STEP, BASELINE,
        "the seed's step: fp32 log-softmax, a fresh value-initialised std::vector, C++ host "
        "top-K, the vector freed", stages=SEED_STAGES, host_top_k=NATIVE_TOP_K),
    Arm("seed_pinned", STEP, CANDIDATE,
        "the seed's step staged through the pinned grow-only scratch", needs_cuda=True,
        stages=SEED_STAGES, buffer=PINNED, host_top_k=NATIVE_TOP_K),
    Arm("seed_pinned_deferred", STEP, LEVER,
        "the seed's step through two pinned grow-only slots with its wait deferred one step: step "
        "i's log-softmax and copy queued into slot i mod 2 with an event, the host waiting for "
        "step i - 1's and sorting its slot beside the next forward (logprobs one step late); on "
        "a CPU the slots are pageable and each copy completes at once: no overlap",
        stages=SEED_STAGES, buffer=PINNED, host_top_k=NATIVE_TOP_K),
    Arm("seed_pageable_reused", STEP, LEVER,
        "the seed's step staged through a grow-only pageable buffer: the reuse lever alone",
        stages=SEED_STAGES, buffer=REUSED, host_top_k=NATIVE_TOP_K),
    Arm("seed_pageable_numpy", STEP, LEVER,
        "the seed's step with a fresh zero-filled buffer and numpy's host top-K",
        stages=SEED_STAGES, host_top_k=NUMPY_TOP_K_BACKEND),
    Arm("device_gather", STEP, LEVER,
        "log-softmax then top-K on the device (vLLM V1); only [n, K+1] is copied",
        stages=DEVICE_STAGES),
    Arm("fused", STEP, LEVER,
        "top-K and ranks on raw logits with a per-row logsumexp; only [n, K+1] is copied",
        stages=DEVICE_STAGES),
    Arm("onepass", STEP, LEVER,
        "top-K, logsumexp and rank in one read of the logits (a Triton kernel on a GPU, its "
        "torch reference on a CPU); only [n, K+1] is copied, into pinned memory, one wait",
        stages=DEVICE_STAGES),
    # prompt logprobs (notebook 03): methods, each timed with and without overlap
    Arm("fused", PROMPT, CANDIDATE,
        "top-K and ranks on raw logits, only the selected logprobs formed, in row blocks"),
    Arm("logsoftmax", PROMPT, BASELINE, "a fp32 log-softmax per chunk (vLLM V1)"),
    Arm("head_fused", PROMPT, LEVER,
        "the lm_head one vocabulary tile at a time, folded into per-row running statistics: "
        "no [C, V] logits at all"),
)

# What the levers are, by the arm that pulls each alone (for goals and findings).
REUSE_LEVER = {STAGING: "pageable_reused", STEP: "seed_pageable_reused"}
ZERO_FILL_LEVER = "pageable_fresh_empty"  # against the baseline: what zero-fill and free cost
PIN_PER_CALL = "pinned_fresh"  # pins fresh memory every copy: the one arm cudaHostRegister serves
NUMPY_TOP_K = "seed_pageable_numpy"  # the baseline's step with numpy's host top-K
DEVICE_TOP_K = "device_gather"  # log-softmax and top-K on the device, only [n, K+1] copied
DEFERRED_WAIT = "seed_pinned_deferred"  # the pinned scratch with its wait one step late (step)
FUSED = "fused"  # the fused device path (step) and method (prompt logprobs)
ONE_PASS = "onepass"  # top-K, logsumexp and rank in one read of the logits (step)
HEAD_FUSED = "head_fused"  # the lm_head folded tile by tile into running statistics (prompt)
OVERLAP_SUFFIX = "+overlap"  # a prompt-logprob method whose copies overlap the next chunk


def prompt_arm(method: str, overlap: bool) -> str:
    """The ``arm`` of a prompt-logprob configuration: its method, ``+overlap`` where it overlaps."""
    return f"{method}{OVERLAP_SUFFIX}" if overlap else method


PROMPT_RECOMMENDED_ARM = prompt_arm(FUSED, overlap=True)  # the configuration whose chunk is chosen


def arms(experiment: str) -> tuple[Arm, ...]:
    """The arms of one experiment, in catalogue order."""
    found = tuple(a for a in ARMS if a.experiment == experiment)
    if not found:
        raise ValueError(f"unknown experiment {experiment!r}; valid: "
                         f"{', '.join(n.experiment for n in NOTEBOOKS.values() if n.experiment)}")
    return found


def arm_names(experiment: str) -> tuple[str, ...]:
    """The arm names of one experiment, in catalogue order."""
    return tuple(a.name for a in arms(experiment))


def arm(experiment: str, name: str) -> Arm:
    """One arm's entry (an A/A twin's name gives its arm's entry)."""
    name = name.removesuffix(AA_SUFFIX)
    for entry in arms(experiment):
        if entry.name == name:
            return entry
    raise ValueError(f"unknown {experiment} arm {name!r}; valid: "
                     f"{', '.join(arm_names(experiment))}")


def with_role(experiment: str, role: str) -> tuple[str, ...]:
    """The arm names of one experiment that have ``role``."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; valid: {', '.join(ROLES)}")
    return tuple(a.name for a in arms(experiment) if a.role == role)


def only_with_role(experiment: str, role: str) -> str:
    """The one arm of an experiment with a role that only one arm has."""
    found = with_role(experiment, role)
    if len(found) != 1:
        raise ValueError(f"{experiment} has {len(found)} arms with role {role!r}, not one")
    return found[0]


def decisive_arms() -> tuple[str, str, str]:
    """The arms the verdict decides from, by :data:`DECISIVE_ROLES`: the decisive experiment's
    baseline, its candidate and the baseline's A/A twin."""
    base = only_with_role(DECISIVE_EXPERIMENT, BASELINE)
    by_role = {BASELINE: base, CANDIDATE: only_with_role(DECISIVE_EXPERIMENT, CANDIDATE),
               AA_TWIN: aa_name(base)}
    first, second, third = (by_role[role] for role in DECISIVE_ROLES)
    return first, second, third


def baseline(experiment: str) -> str:
    """What the engine does today, in one experiment."""
    return only_with_role(experiment, BASELINE)


def candidate(experiment: str) -> str:
    """The proposed change, in one experiment."""
    return only_with_role(experiment, CANDIDATE)


# --------------------------------------------------------------------------- step conditions

@dataclass(frozen=True)
class Condition:
    """A condition the engine's step may meet (a "what if"), declared once: the step measures
    the values it is asked for, each row records its value in ``column``, and the verdict decides
    under ``decides`` and says beside it, for each other value measured, whether it changes the
    answer. ``words``: each value in a sentence. ``old_rows``: the value a row written before
    the column existed reads as. ``by_name``: rows name the deciding value by what provides it
    (the process's malloc: glibc, jemalloc...), so any value not in ``values`` reads as
    ``decides``; otherwise such a value (a stranger's) is no value of the condition."""

    name: str
    column: str
    values: tuple[str, ...]
    decides: str
    words: dict[str, str]
    old_rows: str
    by_name: bool = False

    def reads(self, recorded: object) -> str | None:
        """The condition's value a row's recorded value reads as (None: none of its values)."""
        if not isinstance(recorded, str):  # missing (None, NaN, pandas' NA): an older row
            return self.old_rows
        if recorded in self.values:
            return str(recorded)
        return self.decides if self.by_name else None


DEVICE, HOST = "device", "host"  # where the seed arms run the log-softmax
MALLOC, MAPPED_FRESH = "malloc", "mapped fresh"  # the fresh vector's allocator regimes
# How a timed step meets the forward queued before it (its overlap order): ``queued``, the host
# allocates the fresh vector (and zero-fills it) while the forward runs, first waiting at the
# copy; ``waited``, the device is waited on before the allocation begins, so the fill is paid in
# full (the other bound). Either way each timed call is the decode step: forward + step.
QUEUED, WAITED = "queued", "waited"

LOG_SOFTMAX = Condition(
    "log_softmax", "log_softmax", (DEVICE, HOST), DEVICE,
    {DEVICE: "the log-softmax runs on the device, before the copy",
     HOST: "the log-softmax runs on the host, after the copy (the device only casts the logits)"},
    old_rows=DEVICE)
ALLOCATOR = Condition(
    "allocator", "regime", (MALLOC, MAPPED_FRESH), MALLOC,
    {MALLOC: "the fresh vector comes from the process's malloc, as the engine gets it",
     MAPPED_FRESH: "the fresh vector is mapped fresh every step (its pages faulted in anew)"},
    old_rows=MALLOC, by_name=True)
OVERLAP = Condition(
    "overlap", "overlap_order", (QUEUED, WAITED), QUEUED,
    {QUEUED: "the fresh vector's allocation and zero-fill overlap the queued forward",
     WAITED: "the forward is waited on before the allocation, so the zero-fill is paid in full"},
    old_rows=QUEUED)
CONDITIONS = (LOG_SOFTMAX, ALLOCATOR, OVERLAP)


def condition(name: str) -> Condition:
    """The condition named ``name``; ValueError naming the known ones otherwise."""
    for found in CONDITIONS:
        if found.name == name:
            return found
    raise ValueError(f"no step condition {name!r}; known: {', '.join(c.name for c in CONDITIONS)}")


# --------------------------------------------------------------------------------- notebooks

@dataclass(frozen=True)
class Notebook:
    """A notebook of the suite: the question it answers, its experiment and the table it
    writes under ``data/`` (empty where it measures nothing by arm)."""

    name: str
    question: str
    experiment: str = ""
    table: str = ""


ENVIRONMENT_NOTEBOOK = "00_environment"  # the hardware snapshot: measures nothing by arm
VERDICT_NOTEBOOK = "04_verdict"

NOTEBOOKS = {nb.name: nb for nb in (
    Notebook(ENVIRONMENT_NOTEBOOK,
             "which machine, GPU, driver and PCIe link the numbers came from"),
    Notebook("01_d2h_staging",
             "the mechanism, at the copy alone: reuse and pinning measured apart",
             STAGING, "staging"),
    Notebook("02_logprobs_step",
             "the decisive A/B: the seed's whole step with a fresh vector vs the pinned scratch",
             STEP, "step"),
    Notebook("03_prompt_logprobs",
             "chunked prompt logprobs: memory-bounded, exact, and the chunk to use",
             PROMPT, "prompt_logprobs"),
    Notebook(VERDICT_NOTEBOOK,
             "PORT, CLOSE or INCONCLUSIVE per decisive cell and overall"),
    Notebook("05_prediction",
             "the predicted answers per GPU platform, before any lease, on each platform's "
             "usual hosts and published link figures"),
)}


def notebook_of(experiment: str) -> Notebook:
    """The notebook that measures an experiment."""
    for notebook in NOTEBOOKS.values():
        if notebook.experiment == experiment:
            return notebook
    raise ValueError(f"no notebook measures experiment {experiment!r}")


def measuring_notebooks() -> tuple[str, ...]:
    """The notebooks that time arms (each writes one table), in order."""
    return tuple(nb.name for nb in NOTEBOOKS.values() if nb.experiment)


def tables() -> dict[str, str]:
    """Each table under ``data/`` and the notebook that writes it."""
    return {nb.table: nb.name for nb in NOTEBOOKS.values() if nb.table}


def experiment_of(notebook: str) -> str:
    """The experiment a notebook measures ("" where it measures nothing by arm, or is unknown)."""
    return NOTEBOOKS[notebook].experiment if notebook in NOTEBOOKS else ""
