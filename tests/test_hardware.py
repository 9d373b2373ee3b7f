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
    assert not any(section == "machine" for section, _, _ in rows)  # an older snapshot


def test_flatten_shows_the_machine_s_nested_facts_under_dotted_keys():
    rows = machine.flatten({"host": {}, "torch": {}, "gpu": None, "nvml": None, "machine": {
        "runtime": {"kind": "vm", "evidence": ["DMI: QEMU", "flags"]},
        "fresh_fill": {"stages": {"zero_fill": {"minor_faults": 65536}}}}})
    assert ("machine", "runtime.kind", "vm") in rows
    assert ("machine", "runtime.evidence", "DMI: QEMU; flags") in rows
    assert ("machine", "fresh_fill.stages.zero_fill.minor_faults", 65536) in rows


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
    (reason,) = reasons
    assert reason.startswith("NVML: ") and "nvidia-ml-py" in reason and "nvidia-smi" in reason
    assert reason.endswith("(idle link)")


def test_without_nvml_and_nvidia_smi_both_reasons_are_given(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi there
    monkeypatch.setattr(hardware, "nvml_info", _no_nvml)
    info, reasons = hardware.driver_facts(0, under_load=False)
    assert info is None and len(reasons) == 1
    nvml, smi = reasons[0].split("; ")[:2]
    assert nvml.startswith("NVML: ") and "nvidia-ml-py" in nvml and smi.startswith("nvidia-smi: ")


def fake_root(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_runtime_says_vm_container_or_bare_metal_with_its_evidence(tmp_path):
    bare = fake_root(tmp_path / "bare", {"proc/cpuinfo": "flags\t: fpu sse2 avx\n",
                                         "proc/1/cgroup": "0::/init.scope\n"})
    assert hardware.runtime_info(bare)["kind"] == "bare metal"
    vm = fake_root(tmp_path / "vm", {"proc/cpuinfo": "flags\t: fpu hypervisor avx\n",
                                     "sys/class/dmi/id/sys_vendor": "QEMU\n",
                                     "sys/class/dmi/id/product_name": "Standard PC\n"})
    info = hardware.runtime_info(vm)
    assert info["kind"] == "vm" and info["evidence"] == [
        "the CPU flags say hypervisor", "DMI: QEMU Standard PC"]
    both = fake_root(tmp_path / "both", {"proc/cpuinfo": "flags\t: hypervisor\n",
                                         "proc/1/cgroup": "0::/kubepods/pod1\n"})
    assert hardware.runtime_info(both)["kind"] == "container in vm"
    assert hardware.runtime_info(tmp_path / "nothing")["kind"] == "unknown"


def test_thp_affinity_and_cgroup_limits_are_read_where_present(tmp_path):
    root = fake_root(tmp_path, {
        "sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never\n",
        "sys/kernel/mm/transparent_hugepage/defrag": "[always] defer madvise never\n",
        "proc/self/cgroup": "0::/job\n", "sys/fs/cgroup/job/cpu.max": "150000 100000\n",
        "sys/fs/cgroup/job/memory.max": "8589934592\n"})
    assert hardware.thp_info(root) == {"enabled": "madvise", "defrag": "always"}
    assert hardware.cgroup_limits(root) == {"version": 2, "cpu_quota_cores": 1.5,
                                            "memory_max_bytes": 8589934592}
    (root / "sys/fs/cgroup/job/cpu.max").write_text("max 100000\n")
    (root / "sys/fs/cgroup/job/memory.max").write_text("max\n")
    assert hardware.cgroup_limits(root)["cpu_quota_cores"] is None
    assert hardware.cgroup_limits(tmp_path / "none")["version"] is None
    assert hardware.cpu_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_a_fresh_buffer_s_first_touch_faults_and_its_refill_does_not():
    probe = hardware.fresh_fill_probe(64 << 20)
    stages = probe["stages"]
    assert list(stages) == ["allocate", "zero_fill", "refill", "free"]
    pages = (64 << 20) // probe["page_bytes"]
    # first touch maps every page (fewer faults where huge pages back it); the refill maps none
    assert stages["zero_fill"]["minor_faults"] >= pages // 512
    assert stages["refill"]["minor_faults"] < stages["zero_fill"]["minor_faults"]
    assert probe["fill_gbps"] > 0 and probe["bare_metal_typical_gbps"] == 4.0
    assert probe["bare_metal_range_gbps"] == [4.0, 10.0]


def test_the_fill_probe_fills_on_one_thread_as_the_seed_does():
    """Before: it filled on all of torch's threads, while the seed's constructor fills on one."""
    before = torch.get_num_threads()
    probe = hardware.fresh_fill_probe(8 << 20)
    assert probe["fill_threads"] == 1 and torch.get_num_threads() == before


def test_the_snapshot_holds_the_machine_under_the_numbers():
    facts = hardware.snapshot()["machine"]
    assert set(facts) == {"runtime", "thp", "affinity", "cgroup", "fresh_fill"}
    assert facts["runtime"]["kernel"] and facts["fresh_fill"]["stages"]["zero_fill"]


def test_a_numa_node_of_minus_one_is_unknown_not_another_node(monkeypatch):
    monkeypatch.setattr(hardware, "_read_text", lambda path: "-1\n")
    assert hardware.gpu_numa_node("0000:17:00.0") is None
    monkeypatch.setattr(hardware, "_read_text", lambda path: "1\n")
    assert hardware.gpu_numa_node("0000:17:00.0") == 1
