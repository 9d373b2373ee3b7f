"""Prompt logprobs (notebook 03): each configuration's time against unchunked, the recommended chunk
and vocabulary tile, the agreement checks and the memory peaks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from stagelab.analyse import paired
from stagelab.analyse.timings import NO_TILE, _tiles_filled, _tiles_restored, ok_timings
from stagelab.core import catalogue


def prompt_series(frame: pd.DataFrame) -> pd.Series:
    """Each row's configuration as figures and tables name it: the arm, and for head_fused its
    tile (``head_fused+overlap · tile 1024``)."""
    tiles = frame["tile"].astype("Int64") if "tile" in frame else pd.Series(pd.NA, frame.index)
    words = " · tile " + tiles.astype("string")
    return frame["arm"].astype("string") + words.fillna("")


def prompt_time_relative(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean seconds per configuration and its ratio to the same arm's unchunked mean: means, the
    statistic :func:`recommend_chunk` decides on, so that its table, figure and sentence agree."""
    timed = ok_timings(frame)
    if timed.empty:
        return pd.DataFrame(columns=["arm", "tile", "chunk", "rows", "mean_seconds", "relative"])
    means = _tiles_filled(timed).groupby(["arm", "tile", "chunk", "rows"], as_index=False,
                                         observed=True)["seconds"].mean()
    means = means.rename(columns={"seconds": "mean_seconds"})
    unchunked = means[means["chunk"] >= means["rows"]].set_index(["arm", "tile"])["mean_seconds"]
    reference = pd.MultiIndex.from_frame(means[["arm", "tile"]]).map(unchunked.to_dict())
    means["relative"] = means["mean_seconds"] / np.asarray(reference, dtype=float)
    return _tiles_restored(means)


def overlap_effect(frame: pd.DataFrame) -> pd.DataFrame:
    """Per method and chunk: mean seconds with and without overlap, and the ms overlap saves on
    average (means, as every prompt-logprob figure and the chunk recommendation use)."""
    timed = _tiles_filled(ok_timings(frame))
    timed = timed.assign(method=timed["arm"].str.removesuffix(catalogue.OVERLAP_SUFFIX))
    table = timed.pivot_table(index=["method", "tile", "chunk"], columns="overlap",
                              values="seconds", aggfunc="mean", observed=True)
    table = table.rename(columns={True: "overlap_mean_s", False: "plain_mean_s"}).reset_index()
    if {"overlap_mean_s", "plain_mean_s"} <= set(table.columns):
        table["overlap_saves_mean_ms"] = 1e3 * (table["plain_mean_s"] - table["overlap_mean_s"])
    table.columns.name = None
    return _tiles_restored(table)


def recommend_chunk(frame: pd.DataFrame, arm: str = catalogue.PROMPT_RECOMMENDED_ARM,
                    tolerance: float = 0.05, confidence: float = 0.95,
                    seed: int = 0, tile: int | None = None,
                    trusted: bool = True) -> dict[str, Any]:
    """The smallest chunk the run timed (shorter than the prompt) not shown to be more than
    ``tolerance`` slower than the fastest configuration of that arm (unchunked included), with
    the times behind the choice.

    Each chunk's mean time is compared with the fastest's over paired rounds, with a bootstrap CI;
    a chunk qualifies unless the whole CI lies above ``1 + tolerance``. Among those, the smallest
    wins, because a chunk's peak memory grows with its size (chunk x vocabulary). Deciding on CIs
    keeps the choice stable: point estimates on overlapping ranges flipped it between runs. The
    unchunked prompt is the reference, never the recommendation: where no timed chunk qualifies,
    the fastest timed chunk is named (``within_tolerance`` False) and the reason says that
    chunking bought no time here, only bounded memory, at what cost. ``tile``: the head-fused
    tile whose configurations decide (None: those without a tile, or an arm's smallest tile
    where all of its configurations have one).

    No recommendation from noise (``chunk`` None, the reason and ``needs`` say why and what would
    give one): not where the timings are not trustworthy (``trusted`` False: a busy machine), nor
    where a chunk's 5 % question is unresolved (:func:`unresolved`: its CI straddles
    ``1 + tolerance``, or fewer than two paired rounds). Before: 3 rounds on a busy machine
    recommended chunk 256 and tile 1024 (measured 2.5x slower than 2048, CI 0.78-6.13)."""
    timed = _tiles_filled(ok_timings(frame))
    timed = timed[timed["arm"] == arm]
    if tile is None and not timed.empty and not (timed["tile"] == NO_TILE).any():
        tile = int(timed["tile"].min())
    timed = timed[timed["tile"] == (NO_TILE if tile is None else tile)]
    if timed.empty:
        return {"arm": arm, "chunk": None, "reason": f"{arm} was not timed in this run"}
    per_round = timed.pivot_table(index="round", columns="chunk", values="seconds",
                                  aggfunc="mean", observed=True)
    means = per_round.mean().sort_index()
    best_chunk = int(means.idxmin())
    rows = int(timed["rows"].iloc[0])
    ratios = {int(chunk): _ratio_to(per_round, means, int(chunk), best_chunk, confidence, seed)
              for chunk in means.index if chunk < rows}
    if not ratios:
        return {"arm": arm, "chunk": None, "unchunked_rows": rows, "tolerance": tolerance,
                "reason": f"no chunk shorter than the prompt ({rows} rows) was timed: chunking "
                          "was not measured"}
    within = [c for c, (_, low, _) in ratios.items() if low <= 1 + tolerance]
    chunk = min(within) if within else min(ratios, key=lambda c: ratios[c][0])
    held = no_recommendation("chunk", ratios, chunk, tolerance, trusted,
                             per_round.shape[0], rows)
    if held:
        return {"arm": arm, "chunk": None, "unchunked_rows": rows, "tolerance": tolerance,
                **held}
    ratio, low, high = ratios[chunk]
    best_ms = f"{1e3 * float(means[best_chunk]):#.3g}".rstrip(".")  # as tables show it
    where = "the whole prompt" if best_chunk >= rows else f"chunk {best_chunk}"
    fastest = f"the fastest ({best_ms} ms on average, {where})"
    measured = (f"{fastest}: this chunk itself" if chunk == best_chunk else
                f"{fastest}: {ratio:.3f}x of its mean (CI {low:.3f}-{high:.3f})")
    if within:
        reason = (f"the smallest chunk timed not shown to be more than {tolerance:.0%} slower "
                  f"than {measured}; a smaller chunk holds less memory")
    else:
        reason = (f"every chunk timed is more than {tolerance:.0%} slower than the whole prompt: "
                  f"chunking bought no time here, only bounded memory, and chunk {chunk} costs "
                  f"least against {measured}")
    return {"arm": arm, "chunk": chunk, "mean_seconds": float(means[chunk]),
            "best_seconds": float(means[best_chunk]), "best_chunk": best_chunk,
            "ratio_to_best": ratio, "ratio_ci_low": low, "ratio_ci_high": high,
            "unchunked_rows": rows, "tolerance": tolerance, "within_tolerance": bool(within),
            "reason": reason}


MATTERING_CHUNK = 512  # chunk sizes from which prompt logprobs' memory bound matters


def unresolved(ratios: dict[int, tuple[float, float, float]], pick: int,
               tolerance: float) -> list[int]:
    """The configurations (chunks or tiles) whose question "more than ``tolerance`` slower than
    the fastest?" the rounds leave open and which the choice of ``pick`` rests on: ``pick``
    itself and every smaller one (the choice passes over them as slower): those whose CI
    straddles ``1 + tolerance``."""
    bar = 1 + tolerance
    return [c for c, (_, low, high) in sorted(ratios.items()) if c <= pick and low <= bar < high]


def rounds_to_resolve(ratios: dict[int, tuple[float, float, float]], open_: list[int],
                      tolerance: float, rounds: int) -> int | None:
    """Paired rounds that would resolve each open question, were the spread what it was
    (a CI's half-width shrinks as one over the square root of the rounds): the most of them;
    None where a ratio sits on the bar itself."""
    needed = []
    for c in open_:
        point, low, high = ratios[c]
        margin = abs(point - (1 + tolerance))
        if margin <= 0:
            return None
        needed.append(int(np.ceil(rounds * ((high - low) / 2 / margin) ** 2)))
    return max(needed, default=None)


def no_recommendation(what: str, ratios: dict[int, tuple[float, float, float]], pick: int,
                      tolerance: float, trusted: bool, rounds: int,
                      prompt_rows: int) -> dict[str, Any] | None:
    """Why no ``what`` (chunk or tile) is recommended and what would give one, or None where the
    timings can decide: trustworthy, and every question the choice rests on resolved
    (``open``: the chunks or tiles whose question the rounds leave open)."""
    open_ = unresolved(ratios, pick, tolerance)
    if rounds < 2:
        open_ = sorted(ratios)
    if trusted and not open_:
        return None
    needs = []
    if not trusted:
        needs.append("a quiet machine (these timings are not trustworthy)")
    if open_:
        more = rounds_to_resolve(ratios, open_, tolerance, max(rounds, 2))
        needs.append(f"about {more} paired rounds (this run: {rounds})" if more
                     else f"more paired rounds than this run's {rounds}")
    if what == "chunk" and not any(MATTERING_CHUNK <= c < prompt_rows for c in ratios):
        needs.append(f"chunks of {MATTERING_CHUNK} rows or more, shorter than the prompt "
                     f"({prompt_rows} rows)")
    why = ("the timings are not trustworthy (a busy machine)" if not trusted else
           f"the rounds leave open whether {what} "
           f"{', '.join(str(c) for c in open_)} is more than {tolerance:.0%} slower than the "
           "fastest (its CI straddles the bar)")
    return {"recommended": False, "open": open_, "needs": needs,
            "reason": f"no recommendation: {why}; what would give one: {'; '.join(needs)}"}


def _ratio_to(per_round: pd.DataFrame, means: pd.Series, chunk: int, best: int,
              confidence: float, seed: int) -> tuple[float, float, float]:
    """A chunk's mean time over the fastest's, paired by round, with its CI (the point alone
    where fewer than two rounds are shared)."""
    rounds = per_round[[chunk, best]].dropna().to_numpy(dtype=float)
    try:
        return paired.paired_speedup(rounds[:, 0], rounds[:, 1], confidence=confidence,
                                     seed=seed)
    except ValueError:  # fewer than two shared rounds, or bad timings: the point alone
        point = float(means[chunk] / means[best])
        return (point, point, point)


def recommendation_sentence(recommendation: dict[str, Any]) -> str:
    """A :func:`recommend_chunk` or :func:`recommend_tile` result in one sentence, as notebook 03
    and the verdict say it."""
    rec = recommendation
    what = "tile" if "tile" in rec else "chunk"
    at = f", at chunk {rec['chunk']}" if what == "tile" and rec.get("chunk") is not None else ""
    if rec.get(what) is None:
        why = str(rec.get("reason")).removeprefix("no recommendation: ")
        return f"No recommended {what} ({rec.get('arm')}{at}): {why}."
    return f"Recommended {what}: **{rec[what]}** ({rec.get('arm')}{at}): {rec.get('reason')}."


# The head-fused method's memory bound: its peak extra memory at most this share of one
# fp32 [C, V] chunk of logits (issue 39's goal at T = 513, V = 152,064, C = 256).
HEAD_FUSED_MEMORY_SHARE = 0.35
EXACT_ATOL = 5e-5  # logprobs within fp32 tolerance of the reference, ids equal: exact


def recommend_tile(frame: pd.DataFrame, arm: str | None = None, chunk: int | None = None,
                   tolerance: float = 0.05, confidence: float = 0.95, seed: int = 0,
                   share: float = HEAD_FUSED_MEMORY_SHARE,
                   atol: float = EXACT_ATOL, trusted: bool = True) -> dict[str, Any]:
    """The head-fused method's vocabulary tile, chosen as :func:`recommend_chunk` chooses a chunk:
    the smallest eligible tile not shown to be more than ``tolerance`` slower than the fastest
    tile timed (paired rounds, a bootstrap CI: a tile qualifies unless its whole CI lies above
    ``1 + tolerance``), because a smaller tile holds less memory (chunk x tile).

    Eligible: exact (ids equal to its unchunked reference, logprobs within ``atol``) and within
    the memory bound (the measured peak, the model's where none was measured, at most ``share``
    of one fp32 ``[C, V]`` chunk). Tiles are compared at ``chunk`` (None: the largest chunk
    shorter than the prompt timed with every tile). ``arm`` None: the head-fused arm timed with
    the most tiles, ``+overlap`` first. ``candidates`` holds each tile's figures. No
    recommendation from noise, as for a chunk (:func:`no_recommendation`)."""
    timed = ok_timings(frame)
    timed = timed[timed["tile"].notna()] if "tile" in timed else timed.iloc[0:0]
    arm = arm or _tiled_arm(timed)
    timed = timed[timed["arm"] == arm]
    if arm is None or timed.empty:
        return {"arm": arm, "tile": None, "chunk": None,
                "reason": f"{arm or catalogue.HEAD_FUSED} was not timed at any tile in this run"}
    rows = int(timed["rows"].iloc[0])
    chunk = chunk if chunk is not None else _common_chunk(timed, rows)
    at = timed[timed["chunk"] == chunk]
    per_round = at.pivot_table(index="round", columns="tile", values="seconds", aggfunc="mean",
                               observed=True)
    means = per_round.mean().sort_index()
    best = int(means.idxmin())
    chunk_bytes = int(chunk) * int(timed["vocab"].iloc[0]) * 4
    bound = share * chunk_bytes
    candidates = [_tile_candidate(frame, arm, int(tile), chunk, chunk_bytes, bound, atol,
                                  _ratio_to(per_round, means, int(tile), best, confidence, seed),
                                  float(means[tile])) for tile in means.index]
    eligible = [c for c in candidates if c["exact"] and c["within_bound"]]
    found = {"arm": arm, "chunk": int(chunk), "best_tile": best, "tolerance": tolerance,
             "bound_bytes": int(bound), "candidates": candidates}
    if not eligible:
        return {**found, "tile": None,
                "reason": f"no tile timed is both exact (ids equal, logprobs within {atol:g}) "
                          f"and within {share:.2f} x one fp32 [C, V] chunk: see the table"}
    within = [c for c in eligible if c["ratio_ci_low"] <= 1 + tolerance]
    pick = (min(within, key=lambda c: c["tile"]) if within
            else min(eligible, key=lambda c: c["mean_seconds"]))
    ratios = {c["tile"]: (c["ratio_to_best"], c["ratio_ci_low"], c["ratio_ci_high"])
              for c in eligible}
    held = no_recommendation("tile", ratios, pick["tile"], tolerance, trusted,
                             per_round.shape[0], rows)
    if held:
        return {**found, "tile": None, **held}
    return {**found, "tile": pick["tile"], "mean_seconds": pick["mean_seconds"],
            "ratio_to_best": pick["ratio_to_best"], "within_tolerance": bool(within),
            "reason": _tile_reason(
                pick, best, float(means[best]), bool(within), tolerance, share)}


TILE_COLUMNS = ("tile", "chunk", "mean_seconds", "ratio_to_best", "ratio_ci_low",
                "ratio_ci_high", "id_mismatches", "max_abs_error", "exact", "peak_bytes",
                "peak_of", "chunk_share", "within_bound")


def tile_table(recommendation: dict[str, Any]) -> pd.DataFrame:
    """A :func:`recommend_tile` result's figures, one row per tile timed (empty where none
    was): the table beside its sentence."""
    return pd.DataFrame(recommendation.get("candidates", []), columns=list(TILE_COLUMNS))


def _tiled_arm(timed: pd.DataFrame) -> str | None:
    """The head-fused arm timed with the most tiles, ``+overlap`` first (None: none timed)."""
    arms = [catalogue.prompt_arm(catalogue.HEAD_FUSED, overlap) for overlap in (True, False)]
    counts = {arm: timed.loc[timed["arm"] == arm, "tile"].nunique() for arm in arms}
    arm = max(arms, key=lambda a: counts[a])
    return arm if counts[arm] else None


def _common_chunk(timed: pd.DataFrame, rows: int) -> int:
    """The largest chunk timed with every tile, shorter than the prompt where one is."""
    per_tile = timed.groupby("tile", observed=True)["chunk"].agg(lambda c: set(c.astype(int)))
    common = set.intersection(*per_tile)
    chunked = [c for c in common if c < rows]
    return max(chunked or common or {rows})


def _tile_candidate(frame: pd.DataFrame, arm: str, tile: int, chunk: int, chunk_bytes: int,
                    bound: float, atol: float, ratio: tuple[float, float, float],
                    mean: float) -> dict:
    """One tile's figures at ``chunk``: time against the fastest, exactness, peak, bound."""
    rows = frame[(frame["arm"] == arm) & (frame["tile"] == tile) & (frame["chunk"] == chunk)
                 & (frame["status"] == "ok")]

    def first(metric: str, column: str) -> float | None:
        found = rows.loc[rows["metric"] == metric, column].dropna()
        return float(found.iloc[0]) if not found.empty else None

    ids, error = first("id_mismatches", "value"), first("max_abs_error", "value")
    peak, source = None, "not measured"
    for metric, words in (("peak_device_bytes", "device"), ("peak_host_bytes", "host RSS"),
                          ("predicted_peak_bytes", "model")):
        peak = first(metric, "bytes")
        if peak is not None:
            source = words
            break
    return {"tile": tile, "chunk": chunk, "mean_seconds": mean, "ratio_to_best": ratio[0],
            "ratio_ci_low": ratio[1], "ratio_ci_high": ratio[2],
            "id_mismatches": ids, "max_abs_error": error,
            "exact": ids == 0 and error is not None and error <= atol,
            "peak_bytes": peak, "peak_of": source,
            "chunk_share": None if peak is None else peak / chunk_bytes,
            "within_bound": peak is not None and peak <= bound}


def _tile_reason(pick: dict, best: int, best_seconds: float, within: bool, tolerance: float,
                 share: float) -> str:
    """Why :func:`recommend_tile` chose ``pick``, in words."""
    best_ms = f"{1e3 * best_seconds:#.3g}".rstrip(".")
    fastest = f"the fastest tile ({best_ms} ms on average, tile {best})"
    measured = (f"{fastest}: this tile itself" if pick["tile"] == best else
                f"{fastest}: {pick['ratio_to_best']:.3f}x of its mean (CI "
                f"{pick['ratio_ci_low']:.3f}-{pick['ratio_ci_high']:.3f})")
    held = (f"exact, and its peak ({pick['peak_bytes'] / 2**20:.1f} MiB, {pick['peak_of']}) "
            f"within {share:.2f} x one fp32 [C, V] chunk")
    if within:
        return (f"the smallest exact tile within the memory bound not shown to be more than "
                f"{tolerance:.0%} slower than {measured}; {held}; a smaller tile holds less memory")
    return (f"every exact tile within the memory bound is more than {tolerance:.0%} slower than "
            f"{measured}, and this one costs least; {held}")


def prompt_peaks(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured and predicted peak bytes per arm, tile (head_fused's, else missing) and chunk
    (one column per metric)."""
    mem = frame[frame["metric"].isin(["peak_device_bytes", "peak_host_bytes",
                                      "predicted_peak_bytes"]) & (frame["status"] == "ok")]
    if mem.empty:
        return pd.DataFrame(columns=["arm", "tile", "chunk"])
    table = _tiles_filled(mem).pivot_table(index=["arm", "tile", "chunk"], columns="metric",
                                           values="bytes", aggfunc="first",
                                           observed=True).reset_index()
    table.columns.name = None
    return _tiles_restored(table)

