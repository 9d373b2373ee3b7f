"""The hardware snapshot works without a GPU and says what it could not read."""

import json
import os

import pytest
import torch

from stagelab.measure import device, hardware
from stagelab.present import machine


def test_snapshot_without_a_gpu_has_the_host_and_says_what_is_missing():
    snap = hardware.snapshot()
    json.dumps(snap)  # JSON-ready for the manifest
    host = snap["host"]
    assert host["logical_cores"] >= 1 and host["memory_total_bytes"] > 0 and host["cpu_model"]
    assert snap["torch"]["torch"] == torch.__version__
    if not torch.cuda.is_available():
        assert snap["gpu"] is None
        assert any(reason.startswith("GPU:") for reason in snap["unavailable"])


@pytest.mark.parametrize("gen, width, gbps", [(5, 16, 63.01), (4, 16, 31.5), (3, 16, 15.76),
                                              (4, 8, 15.75), (None, 16, None), (9, 16, None)])
def test_link_bandwidth_per_direction(gen, width, gbps):
    assert hardware.link_bandwidth_gbps(gen, width) == gbps


def test_numa_node_of_an_unknown_bus_is_none():
    assert hardware.gpu_numa_node("00000000:FF:1F.7") is None


def test_flatten_lists_every_section():
    rows = machine.flatten({"host": {"a": 1}, "torch": {"b": 2}, "gpu": None, "nvml": None,
                             "unavailable": ["GPU: none"]})
    assert ("host", "a", 1) in rows and ("gpu", "(unavailable)", "see below") in rows
    assert ("unavailable", "1", "GPU: none") in rows


def test_unavailable_text_lists_what_could_not_be_read():
    assert machine.unavailable_text({"unavailable": ["GPU: none", "NVML: no"]}) == (
        "- GPU: none\n- NVML: no")
    assert machine.unavailable_text({"unavailable": []}).startswith("Everything was read")


def test_device_label_on_cpu():
    assert device.device_label("cpu") == "cpu"


def _no_nvml(*_args, **_kwargs):
    raise ImportError("No module named 'pynvml'")


def test_without_nvml_the_link_is_read_through_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '550.54.15, 5, 16, 00000000:FF:1F.7, 1, 16'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(hardware, "nvml_info", _no_nvml)
    info, reasons = hardware.driver_facts(0, under_load=False)
    assert info["driver"] == "550.54.15" and info["source"] == "nvidia-smi"
    assert (info["pcie_max_gbps_per_direction"], info["pcie_current_gbps_per_direction"]) == (
        63.01, 4.0)
    assert reasons == ["NVML: the nvidia-ml-py package is not installed; read through "
                       "nvidia-smi instead (idle link)"]


def test_without_nvml_and_nvidia_smi_both_reasons_are_given(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi there
    monkeypatch.setattr(hardware, "nvml_info", _no_nvml)
    info, reasons = hardware.driver_facts(0, under_load=False)
    assert info is None and len(reasons) == 1
    assert reasons[0].startswith("NVML: the nvidia-ml-py package is not installed; nvidia-smi: ")
