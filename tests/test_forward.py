"""The decode forward's model: active weights and the KV cache at a stated context."""

from __future__ import annotations

import pytest

from stagelab.core import forward


def test_every_model_has_its_forward_dimensions_and_a_source():
    for name, row in forward.model_table().items():
        dims = forward.model_dims(name)
        assert dims.layers > 0 and dims.kv_heads > 0 and dims.head_dim > 0
        assert 0 < dims.active_params_b <= float(row["params_b"])
        assert row["source"].startswith("https://huggingface.co/")


def test_the_kv_cache_of_a_token_follows_the_config():
    # Qwen2.5-7B: 28 layers x 4 KV heads x 128 x (K and V) x 2 B
    assert forward.model_dims("Qwen2.5-7B").kv_bytes_per_token() == 28 * 4 * 128 * 2 * 2
    # DeepSeek-V3's MLA caches one latent of 512 + 64 per layer
    assert forward.model_dims("DeepSeek-V3").kv_bytes_per_token() == 61 * 576 * 2


def test_moe_models_read_their_active_parameters_only():
    assert forward.model_dims("DeepSeek-V3").active_params_b == 37
    assert forward.model_dims("gpt-oss-20b").active_params_b == 3.6


def test_the_forward_grows_with_rows_and_context():
    qwen = forward.model_dims("Qwen2.5-7B")
    floor = 1e3 * 7.61e9 * 2 / 4800e9  # weights only, at peak: the old formula
    at = [forward.forward_ms(qwen, n, peak_gbps=4800.0) / floor for n in (16, 256)]
    assert at == pytest.approx([1.40, 3.72], abs=0.01)  # the model's figures, not a measurement
    assert forward.forward_ms(qwen, 16, peak_gbps=4800.0, context=0, fraction=1.0) == \
        pytest.approx(floor)


@pytest.mark.parametrize("name, gbps", [("NVIDIA L40", 864.0), ("NVIDIA L4", 300.0),
                                        ("NVIDIA L40S", 864.0), ("NVIDIA H100 PCIe", 2000.0),
                                        ("NVIDIA H100 80GB HBM3", 3350.0), ("NVIDIA H200", 4800.0),
                                        ("NVIDIA A10G", 600.0), ("NVIDIA L4X", None),
                                        ("a GPU nobody knows", None)])
def test_gpu_names_are_matched_exactly(name, gbps):
    assert forward.peak_bandwidth_gbps(name) == gbps


@pytest.mark.parametrize("kwargs, message", [
    (dict(rows=-1), "rows"), (dict(context=1.5), "context"), (dict(peak_gbps=0), "peak_gbps"),
    (dict(fraction=1.5), "fraction")])
def test_bad_forward_input_names_the_parameter(kwargs, message):
    args = dict(rows=16, peak_gbps=4800.0) | kwargs
    rows = args.pop("rows")
    with pytest.raises(ValueError, match=message):
        forward.forward_ms(forward.model_dims("Qwen2.5-7B"), rows, **args)
    with pytest.raises(ValueError, match="unknown 'nope'"):
        forward.model_dims("nope")
