"""Model shapes from data/model_shapes.csv and size parameters."""

import pytest
import torch

from stagelab.measure import shapes


def test_names_and_numbers_resolve():
    qwen, plain = shapes.resolve_vocabs(["Qwen2.5-7B", 1000])
    assert (qwen.vocab, qwen.hidden) == (152064, 3584) and plain == shapes.ModelShape("", 1000, 0)


def test_every_shape_has_a_source():
    table = shapes.model_shapes()
    assert len(table) >= 10 and "Qwen2.5-7B" in table
    assert all(row["source"].startswith("https://") and int(row["vocab"]) > 0
               for row in table.values())


@pytest.mark.parametrize("items, message", [([], "models is empty"), (["GPT-5"], "unknown model 'GPT-5'"),
                                            ([0], "must be positive"), ([True], "neither")])
def test_bad_models_are_named(items, message):
    with pytest.raises(ValueError, match=message):
        shapes.resolve_vocabs(items)


def test_sizes_and_dtypes():
    assert shapes.positive_ints([1, 2], "rows") == [1, 2]
    with pytest.raises(ValueError, match="rows: -1 is not a positive integer"):
        shapes.positive_ints([1, -1], "rows")
    assert shapes.torch_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="dtype: unsupported dtype 'int8'"):
        shapes.torch_dtype("int8")
