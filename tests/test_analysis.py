"""The torch-free analysis floor on small hand-made tables with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stagelab import analysis


def _timings_frame(arms: dict[str, list[float]], repeats: list[int], **cell) -> pd.DataFrame:
    rows = [dict(arm=arm, repeat=r, seconds=s, metric="time", stage="total", status="ok", **cell)
            for arm, seconds in arms.items() for r, s in zip(repeats, seconds)]
    return pd.DataFrame(rows)


def test_compare_pairs_rounds_by_repeat():
    drift = [1.0, 5.0, 2.0, 9.0, 3.0]
    base = _timings_frame({"fresh": drift, "fresh~aa": drift}, [0, 1, 2, 3, 4], rows=8)
    # the candidate's rows arrive in another order, and its round 4 is missing
    cand = _timings_frame({"pinned": [d / 2 for d in drift[:4]][::-1]}, [3, 2, 1, 0], rows=8)
    other = _timings_frame({"fresh": [1.0, 1.0], "pinned": [0.25, 0.25]}, [0, 1], rows=64)
    frame = pd.concat([base, cand, other]).sample(frac=1.0, random_state=0)
    out = analysis.compare(frame, "fresh", "pinned", ["rows"], twin=True)
    small = out.set_index("rows").loc[8]
    assert small["n_rounds"] == 4 and small["speedup"] == 2.0
    assert (small["ci_low"], small["ci_high"]) == (2.0, 2.0)  # paired: the drift cancels
    assert small["twin_speedup"] == 1.0
    assert small["saved_ms"] == pytest.approx(1e3 * np.median(drift[:4]) / 2)
    assert out.set_index("rows").loc[64, "speedup"] == 4.0


def test_compare_refuses_two_timings_of_one_round_in_a_cell():
    frame = pd.concat([_timings_frame({"a": [1.0, 1.0], "b": [1.0, 1.0]}, [0, 1], rows=r)
                       for r in (8, 64)])
    with pytest.raises(ValueError, match=r"arm 'a' has several timings for one round"):
        analysis.compare(frame.assign(k=5), "a", "b", ["k"])
    assert len(analysis.compare(frame.assign(k=5), "a", "b", ["k", "rows"])) == 2


