"""A whole logprobs step, device logits in, host :class:`LogprobsTensors` out, as named arms.

| arm | device work | copy to host | host work |
|---|---|---|---|
| ``seed_pageable`` | fp32 log-softmax ``[n, V]`` | ``[n, V]`` into a fresh pageable buffer | numpy top-K per row |
| ``seed_pinned`` | the same | ``[n, V]`` into the pinned grow-only scratch | the same |
| ``device_gather`` | log-softmax, then top-K (vLLM V1) | ``[n, K+1]`` results | none |
| ``fused`` | top-K and ranks on raw logits + logsumexp | ``[n, K+1]`` results | none |

Each arm reports its stages' seconds (host clock, with a device synchronize at every stage
boundary, so a stage's time is its own): ``device``, ``copy``, ``host_gather``.
"""

from __future__ import annotations

import time
from typing import Callable

import pandas as pd
import torch

from stagelab import bench, memory, staging, stats
from stagelab import logprobs as lp
from stagelab.device import device_label
from stagelab.shapes import positive_ints

STEP_ARMS = ("seed_pageable", "seed_pinned", "device_gather", "fused")
STAGES = ("device", "copy", "host_gather")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepPipeline:
    """One arm: ``run(logits, K, token_ids) -> (host LogprobsTensors, {stage: seconds})``."""

    def __init__(self, name: str, stager: staging.StagingArm | None = None) -> None:
        """``stager`` replaces a seed arm's staging (tests inject a recording allocator)."""
        if name not in STEP_ARMS:
            raise ValueError(f"arms: unknown step arm {name!r}; valid: {', '.join(STEP_ARMS)}")
        self.name = name
        if stager is not None and name.startswith("seed"):
            self.staging = stager
        elif name == "seed_pageable":
            self.staging: staging.StagingArm | None = staging.PageableFresh()
        elif name == "seed_pinned":
            self.staging = staging.PinnedGrowOnly()  # PinnedMemoryUnavailable without CUDA
        else:
            self.staging = None

    def run(self, logits: torch.Tensor, num_logprobs: int,
            token_ids: torch.Tensor) -> tuple[lp.LogprobsTensors, dict[str, float]]:
        device = logits.device
        times: dict[str, float] = {}

        def timed(stage: str, work: Callable[[], object]) -> object:
            start = time.perf_counter()
            result = work()
            _sync(device)
            times[stage] = time.perf_counter() - start
            return result

        if self.staging is not None:
            logprobs = timed("device", lambda: lp.compute_logprobs(logits))
            host = timed("copy", lambda: self.staging.stage(logprobs))
            result = timed("host_gather",
                           lambda: lp.gather_logprobs_host(host, num_logprobs, token_ids.cpu()))
            return result, times
        if self.name == "device_gather":
            on_device = timed("device", lambda: lp.gather_logprobs(
                lp.compute_logprobs(logits), num_logprobs, token_ids))
        else:
            on_device = timed("device", lambda: lp.logprobs_from_logits(
                logits, num_logprobs, token_ids))
        result = timed("copy", on_device.to_host)
        times["host_gather"] = 0.0
        return result, times


def build_pipelines(names: list[str]) -> tuple[dict[str, StepPipeline], dict[str, str]]:
    """The named arms that can run here, and the reason for each that cannot."""
    built, unavailable = {}, {}
    for name in names:
        try:
            built[name] = StepPipeline(name)
        except staging.PinnedMemoryUnavailable as exc:
            unavailable[name] = str(exc)
    return built, unavailable


def sweep(shapes: list, rows: list[int], ks: list[int], logits_dtype: torch.dtype,
          arms: list[str], *, repeats: int, warmup: int = 2, sources: int = 2, seed: int = 0,
          device: str | None = None, progress: bool = False) -> list[dict]:
    """Time every arm's whole step per ``(n, V, K)`` cell, interleaved; schema records out.

    Also records, per arm and cell, the largest difference of its logprobs from the fused arm's
    and how many ranks differ (metric ``max_abs_error`` and ``rank_mismatches``), so that a
    speed comparison is never one between different answers.
    """
    positive_ints(rows, "rows")
    positive_ints([sources], "sources")
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in ks):
        raise ValueError(f"ks: {ks!r} must be a non-empty list of integers >= 0")
    for name in arms:
        if name not in STEP_ARMS:
            raise ValueError(f"arms: unknown step arm {name!r}; valid: {', '.join(STEP_ARMS)}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    label = device_label(device)
    itemsize = torch.empty((), dtype=logits_dtype).element_size()
    generator = torch.Generator(device=device).manual_seed(seed)
    built, unavailable = build_pipelines(arms)
    records: list[dict] = []
    for shape in shapes:
        for n in rows:
            for k in ks:
                sizes = dict(experiment="step", device=label, model=shape.model, rows=n,
                             vocab=shape.vocab, k=k,
                             dtype=str(logits_dtype).removeprefix("torch."))
                try:
                    lp.check_num_logprobs(k, shape.vocab)
                    need = n * shape.vocab * (sources * itemsize + 4 * 3)
                    memory.check_fits(need, memory.free_device_bytes(device)
                                      or memory.free_host_bytes(),
                                      f"step n={n} V={shape.vocab}")
                except (ValueError, memory.InsufficientMemory) as exc:
                    records += [{**sizes, "arm": a, "status": "skipped", "note": str(exc)}
                                for a in arms]
                    continue
                records += [{**sizes, "arm": a, "status": "unavailable", "note": why}
                            for a, why in unavailable.items()]
                logits = bench.rotating(lambda i: (3 * torch.randn(
                    n, shape.vocab, device=device, generator=generator)).to(logits_dtype),
                    sources)
                tokens = [torch.randint(0, shape.vocab, (n,), device=device,
                                        generator=generator) for _ in range(sources)]
                calls = {name: (lambda r, p=p: p.run(bench.pick(logits, r), k,
                                                     bench.pick(tokens, r))[1])
                         for name, p in built.items()}
                timings = bench.interleaved(calls, repeats=repeats, warmup=warmup, seed=seed,
                                            device=device, progress=progress,
                                            label=f"n={n} V={shape.vocab} K={k}")
                nbytes = {name: _copied_bytes(name, n, shape.vocab, k) for name in built}
                records += [{**sizes, **t, "bytes": nbytes[t["arm"]] if t["stage"] == "copy"
                             else None} for t in timings]
                records += agreement(built, logits[0], k, tokens[0], sizes)
                del logits, tokens
    return records


def _copied_bytes(arm: str, n: int, vocab: int, k: int) -> int:
    """Bytes an arm moves from device to host per step."""
    if arm.startswith("seed"):
        return n * vocab * 4
    return n * (k + 1) * 8 + n * 4


def agreement(pipelines: dict[str, StepPipeline], logits: torch.Tensor, k: int,
              tokens: torch.Tensor, sizes: dict) -> list[dict]:
    """Each arm's largest logprob difference from the fused arm's, and its rank mismatches."""
    reference, _ = StepPipeline("fused").run(logits, k, tokens)
    rows = []
    for name, pipeline in pipelines.items():
        result, _ = pipeline.run(logits, k, tokens)
        error = float((result.logprobs - reference.logprobs).abs().max())
        mismatches = int((result.selected_token_ranks != reference.selected_token_ranks).sum())
        rows += [{**sizes, "arm": name, "metric": "max_abs_error", "value": error},
                 {**sizes, "arm": name, "metric": "rank_mismatches", "value": float(mismatches)}]
    return rows


def decomposition(frame: pd.DataFrame) -> pd.DataFrame:
    """Median seconds per stage and in total, per arm and cell, with each stage's share."""
    timed = frame[(frame["metric"] == "time") & (frame["status"] == "ok")]
    med = timed.pivot_table(index=["rows", "vocab", "k", "arm"], columns="stage",
                            values="seconds", aggfunc="median", observed=True)
    med = med.reindex(columns=[*STAGES, "total"]).fillna(0.0).reset_index()
    for stage in STAGES:
        med[f"{stage}_share"] = med[stage] / med["total"]
    return pd.DataFrame(med)


DWARFED_SHARE = 0.10


def is_copy_dwarfed(frame: pd.DataFrame) -> list[str]:
    """Plain sentences, one per cell, answering "is the copy dwarfed?" for the seed's step, from
    this run's medians. The copy counts as dwarfed when it is under 10 % of the step."""
    parts = decomposition(frame)
    seed = parts[parts["arm"] == "seed_pageable"]
    sentences = []
    for _, row in seed.iterrows():
        verdict = "dwarfed" if row["copy_share"] < DWARFED_SHARE else "not dwarfed"
        sentences.append(
            f"n={row['rows']}, V={row['vocab']}, K={row['k']}: the copy took "
            f"{1e3 * row['copy']:.2f} ms of a {1e3 * row['total']:.2f} ms step "
            f"({row['copy_share']:.0%}); the host top-K {1e3 * row['host_gather']:.2f} ms "
            f"({row['host_gather_share']:.0%}); device work {1e3 * row['device']:.2f} ms. "
            f"The copy is {verdict}.")
    return sentences


def lever_savings(frame: pd.DataFrame, baseline: str = "seed_pageable",
                  seed: int = 0) -> pd.DataFrame:
    """Per cell and lever: speedup of the whole step over the seed's arm, its CI, ms saved."""
    timed = frame[(frame["metric"] == "time") & (frame["status"] == "ok")]
    levers = [arm for arm in STEP_ARMS if arm != baseline and arm in set(timed["arm"])]
    parts = [stats.compare_arms(frame, baseline, arm, ["rows", "vocab", "k"], seed=seed)
             for arm in levers]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def fused_goal(frame: pd.DataFrame, target_rows: int = 64, target_vocab: int = 152_064, target_k: int = 5,
               goal: float = 10.0) -> str:
    """The suite's goal for the fused arm (>= 10x the seed's step at n=64, V~152k, K=5), against
    the nearest measured cell, in words."""
    savings = lever_savings(frame)
    if savings.empty or "fused" not in set(savings["candidate"]):
        return "Not measured: the fused and seed arms were not both timed in this run."
    fused = savings[savings["candidate"] == "fused"].copy()
    fused["distance"] = (abs(fused["rows"] - target_rows) / target_rows
                         + abs(fused["vocab"] - target_vocab) / target_vocab
                         + abs(fused["k"] - target_k))
    cell = fused.sort_values("distance").iloc[0]
    met = "met" if cell["ci_low"] >= goal else "not met"
    exact = "the goal's cell" if cell["distance"] == 0 else "the nearest measured cell"
    return (f"At {exact} (n={cell['rows']}, V={cell['vocab']}, K={cell['k']}) the fused arm's "
            f"step is {cell['speedup']:.1f}x the seed's (95 % CI {cell['ci_low']:.1f}-"
            f"{cell['ci_high']:.1f}x): goal of {goal:.0f}x {met}.")
