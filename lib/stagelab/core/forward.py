"""The decode forward's device time as an engine has it: the weights and the KV cache read once.

A decode step at small batch is bound by memory bandwidth: every active weight is read once, and
every sequence of the batch reads its own KV cache (``context`` tokens of keys and values per
layer; a sliding-window layer only its last ``sliding_window`` tokens). So ``forward_ms =
(active params x 2 B + rows x KV bytes of one sequence at context) / (fraction x peak
bandwidth)``, all in bf16. MoE models count their active parameters only.

Why these numbers (stated once, here):

* ``DEFAULT_CONTEXT`` = 2048 tokens: a typical chat request's prompt and answer so far; the KV
  read grows linearly with it, so give the engine's own where it is known.
* ``ACHIEVABLE_FRACTION`` = 0.8 of the datasheet bandwidth: streaming kernels on HBM reach
  about 80-90 % of it (coalesced weight loads on an H100 SXM, 2.8 of 3.35 TB/s, 84 %, from a
  Nsight Compute study of a 70B decode: mikamirai.com/blog/gpu-memory-bandwidth), and decode
  attention over a paged KV cache less; 0.8 is the optimistic end for the whole forward, so the
  forward is not overstated (a longer forward raises the bar in ms and leans to CLOSE). With it
  the model gives a Qwen2.5-7B decode on an H200 at 2k context 1.4-3.7x the weights-only floor
  at n = 16-256 (a model, not a measurement: no measured decode figure backs it yet).
* Sliding windows (``sliding_window``, ``sliding_layers`` of ``data/model_shapes.csv``, from each
  model's config.json): Gemma-3's 1,024-token window on 29 of its 34 layers reads 1.7x less KV
  at 2k context than every layer at full context would.
* Peak bandwidths are NVIDIA's datasheet figures, matched on the exact device name (an "L40" is
  not an "L4").

Standard library only: the measuring floor and the analysis both read it.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from stagelab.core import catalogue, paths

DEFAULT_CONTEXT = 2048
ACHIEVABLE_FRACTION = 0.8
BYTES_PER_VALUE = 2  # bf16 weights and KV cache

# How a timed step meets the forward queued before it: the overlap condition of the catalogue.
QUEUED, WAITED = catalogue.QUEUED, catalogue.WAITED
OVERLAP_ORDERS = catalogue.OVERLAP.values
ORDER_WORDS = catalogue.OVERLAP.words

# Datasheet peak memory bandwidth (GB/s) by the exact name CUDA reports, less "NVIDIA ".
PEAK_BANDWIDTH_GBPS = {
    "H200": 4800.0, "H200 NVL": 4800.0, "H100 80GB HBM3": 3350.0, "H100 NVL": 3900.0,
    "H100 PCIe": 2000.0, "A100-SXM4-80GB": 2039.0, "A100 80GB PCIe": 1935.0,
    "A100-SXM4-40GB": 1555.0, "A100-PCIE-40GB": 1555.0, "L40S": 864.0, "L40": 864.0,
    "L4": 300.0, "A10": 600.0, "A10G": 600.0,
}


def device_key(gpu_name: str | None) -> str:
    """A GPU's name as CUDA reports it, less "NVIDIA " and surrounding blanks: the key of
    :data:`PEAK_BANDWIDTH_GBPS` ("" for None)."""
    return (gpu_name or "").strip().removeprefix("NVIDIA ").strip()


def peak_bandwidth_gbps(gpu_name: str) -> float | None:
    """The datasheet peak memory bandwidth of a GPU by its exact name (with or without the
    leading "NVIDIA "); None when unknown (never a near match: "L40" is not "L4")."""
    return PEAK_BANDWIDTH_GBPS.get(device_key(gpu_name))


@dataclass(frozen=True)
class ModelDims:
    """What a decode forward reads: the active parameters (billions) and the KV cache's shape
    (``kv_tensors`` is 2 for keys and values, 1 for one shared latent as in MLA), and how many
    layers attend only a window of the last ``sliding_window`` tokens (0: none)."""

    model: str
    active_params_b: float
    layers: int
    kv_heads: int
    head_dim: int
    kv_tensors: int = 2
    sliding_window: int = 0
    sliding_layers: int = 0
    params_b: float = 0.0  # every parameter (an MoE holds them all in memory), billions

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token holds across every layer."""
        return self.layers * self.kv_heads * self.head_dim * self.kv_tensors * BYTES_PER_VALUE

    def kv_bytes(self, context: int) -> int:
        """Bytes of KV cache one sequence reads at ``context`` tokens: every full-attention
        layer the whole context, a sliding-window layer at most its window."""
        per_layer = self.kv_bytes_per_token() // self.layers
        windowed = self.sliding_layers if self.sliding_window else 0
        seen = min(context, self.sliding_window) if windowed else context
        return per_layer * ((self.layers - windowed) * context + windowed * seen)


@lru_cache(maxsize=4)
def model_table(path: Path = paths.MODEL_SHAPES_FILE) -> dict[str, dict[str, str]]:
    """``data/model_shapes.csv`` by model name, each row with its source column."""
    with open(path, newline="", encoding="utf-8") as handle:
        return {row["model"]: row for row in csv.DictReader(handle)}


def model_dims(model: str) -> ModelDims:
    """A model's forward dimensions from ``data/model_shapes.csv``; a clear error otherwise."""
    row = model_table().get(model)
    if row is None:
        raise ValueError(f"model: unknown {model!r}; known: {', '.join(model_table())}")
    return ModelDims(model, float(row["active_params_b"]), int(row["layers"]),
                     int(row["kv_heads"]), int(row["head_dim"]), int(row["kv_tensors"]),
                     int(row.get("sliding_window") or 0), int(row.get("sliding_layers") or 0),
                     float(row.get("params_b") or row["active_params_b"]))


def forward_bytes(dims: ModelDims, rows: int, context: int = DEFAULT_CONTEXT) -> float:
    """Bytes one decode step of ``rows`` sequences reads: the active weights once, and each
    sequence's KV cache of ``context`` tokens (a sliding-window layer at most its window)."""
    for name, value in (("rows", rows), ("context", context)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    weights = dims.active_params_b * 1e9 * BYTES_PER_VALUE
    return weights + rows * dims.kv_bytes(context)


def memory_bytes(dims: ModelDims, rows: int, vocab: int, context: int = DEFAULT_CONTEXT) -> float:
    """Bytes a decode step of ``rows`` sequences holds on the GPU at least: every bf16 weight,
    each sequence's KV cache at ``context`` tokens, the bf16 logits and their fp32 log-probs."""
    weights = (dims.params_b or dims.active_params_b) * 1e9 * BYTES_PER_VALUE
    return weights + rows * dims.kv_bytes(context) + rows * vocab * (BYTES_PER_VALUE + 4)


def forward_ms(dims: ModelDims, rows: int, *, peak_gbps: float,
               context: int = DEFAULT_CONTEXT, fraction: float = ACHIEVABLE_FRACTION) -> float:
    """The device time of one decode forward, ms: :func:`forward_bytes` at ``fraction`` of the
    GPU's peak memory bandwidth ``peak_gbps`` (see the module's note for the defaults)."""
    if not peak_gbps > 0:
        raise ValueError(f"peak_gbps must be positive, got {peak_gbps!r}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction!r}")
    return 1e3 * forward_bytes(dims, rows, context) / (fraction * peak_gbps * 1e9)


def forward_words(dims: ModelDims, rows: int, *, peak_gbps: float, gpu: str = "",
                  context: int = DEFAULT_CONTEXT, fraction: float = ACHIEVABLE_FRACTION) -> str:
    """How :func:`forward_ms` reached its figure, in one line (the note of every forward row)."""
    ms = forward_ms(dims, rows, peak_gbps=peak_gbps, context=context, fraction=fraction)
    kv_gb = rows * dims.kv_bytes(context) / 1e9
    weights_gb = dims.active_params_b * BYTES_PER_VALUE
    return (f"({weights_gb:.2f} GB active bf16 weights + {kv_gb:.2f} GB KV cache of {rows} x "
            f"{context} tokens) / ({fraction:g} x {peak_gbps:g} GB/s{' ' + gpu if gpu else ''})"
            f" = {ms:.2f} ms")
