"""The tidy schema: strict columns, derived rates, round trips, clear errors for bad files."""

import pandas as pd
import pytest

from stagelab.core import schema


def test_make_rows_fills_defaults_and_derives_rates():
    frame = schema.make_rows([{"seconds": 0.25, "bytes": 10**9}, {"metric": "peak_host_bytes",
                              "bytes": 5}], experiment="e", arm="a")
    assert list(frame.columns) == list(schema.COLUMNS)
    assert frame.loc[0, "gb_per_s"] == 4.0 and pd.isna(frame.loc[1, "gb_per_s"])
    assert list(frame["stage"]) == ["total", "total"] and list(frame["status"]) == ["ok", "ok"]


def test_unknown_columns_and_statuses_are_refused():
    with pytest.raises(schema.SchemaError, match=r"unknown column\(s\) \['secs'\]"):
        schema.make_rows([{"secs": 1.0}])
    with pytest.raises(schema.SchemaError, match="unknown status"):
        schema.make_rows([{"status": "maybe"}])


def test_write_and_read_round_trip(tmp_path):
    frame = schema.make_rows([{"seconds": 1.0, "bytes": 8, "rows": 2, "overlap": True}],
                             run_id="r", notebook="n", experiment="e", arm="a")
    path = schema.write_table(frame, tmp_path, "t")
    assert path == tmp_path / "data" / "t.parquet"
    pd.testing.assert_frame_equal(schema.read_table(tmp_path, "t"), frame)


def test_corrupt_and_foreign_tables_name_the_file(tmp_path):
    path = schema.table_path(tmp_path, "bad")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not parquet")
    with pytest.raises(schema.SchemaError, match="bad.parquet: cannot be read"):
        schema.read_table(tmp_path, "bad")
    pd.DataFrame({"x": [1]}).to_parquet(schema.table_path(tmp_path, "foreign"))
    with pytest.raises(schema.SchemaError, match="foreign.parquet: table does not follow"):
        schema.read_table(tmp_path, "foreign")
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        schema.read_table(tmp_path, "missing")
