"""A snapshot of the machine the numbers came from: host, torch and CUDA, GPU, and its PCIe link.

The driver and link facts come from NVML (nvidia-ml-py) where it is importable, else from
``nvidia-smi``. With no GPU, no CUDA build, no NVML and no ``nvidia-smi`` the snapshot still
returns the host part and lists in ``unavailable`` what could not be read, in plain words.
"""

from __future__ import annotations

import os
import platform
import resource
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import torch

# PCIe usable bandwidth per lane and direction, GB/s, after line encoding (8b/10b, then 128b/130b).
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}


def link_bandwidth_gbps(generation: int | None, width: int | None) -> float | None:
    """Theoretical bandwidth per direction of a PCIe link, GB/s; None when unknown."""
    if not generation or not width or generation not in PCIE_GBPS_PER_LANE:
        return None
    return round(PCIE_GBPS_PER_LANE[generation] * width, 2)


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _meminfo_bytes(key: str) -> int | None:
    for line in _read_text("/proc/meminfo").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return None


def host_info() -> dict[str, Any]:
    """The host: name, OS, CPU model, logical cores, memory."""
    cpu_model = next((line.split(":", 1)[1].strip()
                      for line in _read_text("/proc/cpuinfo").splitlines()
                      if line.startswith("model name")), platform.processor() or "unknown")
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model,
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_total_bytes": _meminfo_bytes("MemTotal"),
        "memory_available_bytes": _meminfo_bytes("MemAvailable"),
        "torch_threads": torch.get_num_threads(),
    }


def torch_info() -> dict[str, Any]:
    """torch's version and the CUDA it was built with (None on a CPU build)."""
    return {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
    }


def gpu_info(index: int = 0) -> dict[str, Any]:
    """Name, compute capability and memory of one CUDA device, as torch sees it."""
    props = torch.cuda.get_device_properties(index)
    return {
        "index": index,
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "memory_total_bytes": props.total_memory,
        "multiprocessors": props.multi_processor_count,
    }


def _busy_copy_loop(stop: threading.Event, index: int) -> None:
    """Keep the link busy with device-to-host copies so that it trains up to its working speed."""
    src = torch.empty(64 << 20, dtype=torch.uint8, device=f"cuda:{index}")
    dst = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    while not stop.is_set():
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(index)


def nvml_handle(pynvml: Any, cuda_index: int = 0) -> Any:
    """NVML's handle of the GPU that CUDA calls ``cuda_index``. NVML ignores
    ``CUDA_VISIBLE_DEVICES``, so the two numberings can differ: the device is found by its UUID
    where torch can tell it, by index otherwise (then they agree unless devices are hidden)."""
    if torch.cuda.is_available():
        try:
            uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
            return pynvml.nvmlDeviceGetHandleByUUID(
                uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:  # an older torch without .uuid, or NVML that does not know it
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)


def nvml_info(index: int = 0, under_load: bool = False) -> dict[str, Any]:
    """Driver and PCIe link facts through NVML; ``under_load`` reads the current link during copies.

    Idle links downtrain to save power, so the current generation and width read at idle can be
    lower than what a copy gets; the maximum values are read as well.
    """
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = nvml_handle(pynvml, index)
        info: dict[str, Any] = {
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "pcie_max_generation": pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
            "pcie_max_width": pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
            "pci_bus_id": pynvml.nvmlDeviceGetPciInfo(handle).busId,
        }
        stop = threading.Event()
        worker = threading.Thread(target=_busy_copy_loop, args=(stop, index), daemon=True)
        if under_load:
            worker.start()
            time.sleep(0.3)
        try:
            info["pcie_current_generation"] = pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)
            info["pcie_current_width"] = pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)
        finally:
            stop.set()
            if under_load:
                worker.join()
        info["pcie_read_under_load"] = under_load
    finally:
        pynvml.nvmlShutdown()
    bus_id = info["pci_bus_id"]
    bus_id = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    info["pci_bus_id"] = bus_id
    info["pcie_max_gbps_per_direction"] = link_bandwidth_gbps(
        info["pcie_max_generation"], info["pcie_max_width"])
    info["pcie_current_gbps_per_direction"] = link_bandwidth_gbps(
        info["pcie_current_generation"], info["pcie_current_width"])
    info["numa_node"] = gpu_numa_node(bus_id)
    return info


# nvidia-smi's names for the facts nvml_info reads, in nvml_info's order.
SMI_FIELDS = {"driver": "driver_version", "pcie_max_generation": "pcie.link.gen.max",
              "pcie_max_width": "pcie.link.width.max", "pci_bus_id": "pci.bus_id",
              "pcie_current_generation": "pcie.link.gen.current",
              "pcie_current_width": "pcie.link.width.current"}


def _smi_id(cuda_index: int) -> str:
    """The GPU for ``nvidia-smi --id``: its UUID where torch can tell it (nvidia-smi, like NVML,
    ignores ``CUDA_VISIBLE_DEVICES``), else the index."""
    if torch.cuda.is_available():
        try:
            uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
            return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        except Exception:
            pass
    return str(cuda_index)


def nvidia_smi_info(index: int = 0) -> dict[str, Any]:
    """The facts of :func:`nvml_info` (idle link) read through ``nvidia-smi``, for a node without
    nvidia-ml-py. Raises OSError or RuntimeError, with the reason, where it cannot be read."""
    query = ",".join(SMI_FIELDS.values())
    done = subprocess.run(["nvidia-smi", f"--id={_smi_id(index)}", f"--query-gpu={query}",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi exited {done.returncode}: "
                           f"{(done.stdout + done.stderr).strip()[:200]}")
    values = [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")]
    info: dict[str, Any] = {key: int(v) if v.isdigit() else v
                            for key, v in zip(SMI_FIELDS, values)}
    info["pcie_read_under_load"] = False
    info["source"] = "nvidia-smi"
    info["pcie_max_gbps_per_direction"] = link_bandwidth_gbps(
        info["pcie_max_generation"], info["pcie_max_width"])
    info["pcie_current_gbps_per_direction"] = link_bandwidth_gbps(
        info["pcie_current_generation"], info["pcie_current_width"])
    info["numa_node"] = gpu_numa_node(str(info["pci_bus_id"]))
    return info


def driver_facts(index: int, under_load: bool) -> tuple[dict[str, Any] | None, list[str]]:
    """Driver and link facts from NVML, else ``nvidia-smi``; and why each could not say."""
    try:
        return nvml_info(index, under_load=under_load), []
    except ImportError:
        nvml = "NVML: the nvidia-ml-py package is not installed"
    except Exception as exc:  # pynvml raises NVMLError subclasses, e.g. library not found
        nvml = f"NVML: {type(exc).__name__}: {exc}"
    try:
        return nvidia_smi_info(index), [f"{nvml}; read through nvidia-smi instead (idle link)"]
    except (OSError, RuntimeError, subprocess.SubprocessError, IndexError) as exc:
        return None, [f"{nvml}; nvidia-smi: {type(exc).__name__}: {exc} (driver, PCIe link and "
                      "NUMA node are not known)"]


def gpu_numa_node(pci_bus_id: str) -> int | None:
    """The NUMA node the GPU hangs off, from sysfs; None where the kernel does not say."""
    domain_bus = pci_bus_id.lower()
    if domain_bus.count(":") == 2 and len(domain_bus.split(":")[0]) == 8:
        domain_bus = domain_bus[4:]  # NVML pads the PCI domain to 8 hex digits, sysfs to 4
    text = _read_text(f"/sys/bus/pci/devices/{domain_bus}/numa_node").strip()
    node = int(text) if text.lstrip("-").isdigit() else None
    return node if node is not None and node >= 0 else None  # -1: the kernel does not know


def snapshot(under_load: bool = False, device_index: int = 0) -> dict[str, Any]:
    """The machine as a JSON-ready dict: ``host``, ``torch``, ``gpu``, ``nvml`` and ``unavailable``.

    ``gpu`` and ``nvml`` are None where they cannot be read, and ``unavailable`` says why.
    """
    snap: dict[str, Any] = {"host": host_info(), "torch": torch_info(), "gpu": None, "nvml": None,
                            "unavailable": []}
    if torch.cuda.is_available():
        snap["gpu"] = gpu_info(device_index)
    elif torch.version.cuda is None:
        snap["unavailable"].append("GPU: this torch is a CPU build (no CUDA support compiled in)")
    else:
        snap["unavailable"].append("GPU: torch has CUDA support but sees no CUDA device")
    snap["nvml"], reasons = driver_facts(device_index, under_load and snap["gpu"] is not None)
    snap["unavailable"] += reasons
    snap["machine"] = machine_facts()
    return snap


def sm_clock_sample(index: int = 0) -> tuple[int | None, int | None, str]:
    """The GPU's SM clock (MHz) and its current throttle reasons (NVML's bit mask; 0 is none),
    and why not where NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, or an NVMLError subclass
        return None, None, f"NVML cannot be read here ({type(exc).__name__}: {exc})"
    try:
        handle = nvml_handle(pynvml, index)
        mhz = int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        return mhz, None if reasons is None else int(reasons(handle)), ""
    except Exception as exc:
        return None, None, f"NVML: {type(exc).__name__}: {exc}"
    finally:
        pynvml.nvmlShutdown()


# ------------------------------------------------------------- the machine under the numbers

# The seed's cost is a fresh vector's zero-fill and first-touch page faults, which memory
# virtualisation inflates: a microVM filled one at 1.24-1.42 GB/s (issue 28); bare metal
# typically fills 4-10 GB/s (issue 28's figures; first touch of a fresh tensor measured 1.6-7 GB/s
# on the suite's 2-core VM, the reference notes). Below this rate the verdict says so beside its
# decision, with the range.
BARE_METAL_FILL_GBPS = 4.0
BARE_METAL_FILL_RANGE_GBPS = (4.0, 10.0)
FILL_PROBE_BYTES = 256 << 20  # about the seed's largest step buffer (256 x 262k fp32)
HYPERVISORS = ("kvm", "qemu", "vmware", "virtualbox", "xen", "amazon ec2", "google",
               "microsoft corporation", "firecracker", "cloud hypervisor", "openstack", "bochs")
CONTAINER_MARKS = ("docker", "kubepods", "containerd", "lxc", "libpod", "crio")


def _choice(text: str) -> str | None:
    """The selected word of a sysfs choice line such as ``always [madvise] never``."""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else (text.strip() or None)


def runtime_info(root: Path = Path("/")) -> dict[str, Any]:
    """Bare metal, a VM, a container (or a container in a VM), the kernel, and the evidence for
    it; ``kind`` is ``unknown`` where nothing can be read (not Linux)."""
    evidence = []
    flags = next((line for line in _read_text(str(root / "proc/cpuinfo")).splitlines()
                  if line.startswith("flags")), "")
    vendor = " ".join(_read_text(str(root / f"sys/class/dmi/id/{name}")).strip()
                      for name in ("sys_vendor", "product_name")).strip()
    if " hypervisor" in flags:
        evidence.append("the CPU flags say hypervisor")
    if any(name in vendor.lower() for name in HYPERVISORS):
        evidence.append(f"DMI: {vendor}")
    vm = bool(evidence)
    cgroup = _read_text(str(root / "proc/1/cgroup"))
    marks = [mark for mark in CONTAINER_MARKS if mark in cgroup]
    if (root / ".dockerenv").exists() or (root / "run/.containerenv").exists():
        marks.append("a container runtime's marker file")
    evidence += [f"container: {mark}" for mark in marks]
    if vm or marks:
        kind = " in ".join(k for k, on in (("container", marks), ("vm", vm)) if on)
    else:
        kind = "bare metal" if flags else "unknown"
    return {"kind": kind, "evidence": evidence, "kernel": platform.release(),
            "kernel_version": platform.version()}


def thp_info(root: Path = Path("/")) -> dict[str, Any]:
    """Transparent huge pages: the ``enabled`` and ``defrag`` settings (None where unreadable)."""
    base = root / "sys/kernel/mm/transparent_hugepage"
    return {name: _choice(_read_text(str(base / name))) for name in ("enabled", "defrag")}


def cpu_ranges(cpus: list[int]) -> str:
    """``0-3,8`` for ``[0, 1, 2, 3, 8]``."""
    spans: list[list[int]] = []
    for cpu in sorted(cpus):
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def cgroup_limits(root: Path = Path("/")) -> dict[str, Any]:
    """This process's cgroup CPU quota (cores) and memory limit (bytes); None where there is
    none or it cannot be read. cgroup v2 first, then v1."""
    lines = _read_text(str(root / "proc/self/cgroup")).splitlines()
    v2 = next((line.split("::", 1)[1] for line in lines if line.startswith("0::")), None)
    limits: dict[str, Any] = {"version": None, "cpu_quota_cores": None, "memory_max_bytes": None}
    if v2 is not None:
        folder = root / "sys/fs/cgroup" / v2.lstrip("/")
        quota_period = _read_text(str(folder / "cpu.max")).split()
        memory = _read_text(str(folder / "memory.max")).strip()
        limits["version"] = 2
        if len(quota_period) == 2 and quota_period[0].isdigit():
            limits["cpu_quota_cores"] = round(int(quota_period[0]) / int(quota_period[1]), 3)
        limits["memory_max_bytes"] = int(memory) if memory.isdigit() else None
        return limits
    quota = _read_text(str(root / "sys/fs/cgroup/cpu/cpu.cfs_quota_us")).strip()
    period = _read_text(str(root / "sys/fs/cgroup/cpu/cpu.cfs_period_us")).strip()
    memory = _read_text(str(root / "sys/fs/cgroup/memory/memory.limit_in_bytes")).strip()
    if quota or memory:
        limits["version"] = 1
    if quota.isdigit() and period.isdigit() and int(period):
        limits["cpu_quota_cores"] = round(int(quota) / int(period), 3)
    if memory.isdigit() and int(memory) < 1 << 62:  # v1 says "no limit" with a huge number
        limits["memory_max_bytes"] = int(memory)
    return limits


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def fresh_fill_probe(nbytes: int = FILL_PROBE_BYTES) -> dict[str, Any]:
    """A fresh host buffer as the seed makes one each step, stage by stage: allocate, the
    zero-fill (first touch: the page faults), a second fill (the pages mapped), free; seconds
    and minor page faults of each, and the fresh fill rate. Garbage collection is held off; the
    fills run on one thread, as the seed's vector constructor fills (on 16 cores torch's own
    threads would report several times the seed's rate); ``fill_threads`` is read inside."""
    import gc

    from stagelab.measure.hostrates import one_thread

    elements = nbytes // 4
    stages: dict[str, dict[str, float]] = {}

    def timed(name: str, work: Any) -> Any:
        faults, started = _minor_faults(), time.perf_counter()
        result = work()
        stages[name] = {"seconds": round(time.perf_counter() - started, 6),
                        "minor_faults": _minor_faults() - faults}
        return result

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with one_thread():
            threads = torch.get_num_threads()
            buffer = timed("allocate", lambda: torch.empty(elements, dtype=torch.float32))
            timed("zero_fill", buffer.zero_)
            timed("refill", buffer.zero_)
            timed("free", lambda: buffer.set_())
    finally:
        if was_enabled:
            gc.enable()
    fill_s = stages["zero_fill"]["seconds"]
    return {"bytes": nbytes, "stages": stages, "page_bytes": resource.getpagesize(),
            "fill_gbps": round(nbytes / fill_s / 1e9, 3) if fill_s > 0 else None,
            "refill_gbps": (round(nbytes / stages["refill"]["seconds"] / 1e9, 3)
                            if stages["refill"]["seconds"] > 0 else None),
            "bare_metal_typical_gbps": BARE_METAL_FILL_GBPS,
            "bare_metal_range_gbps": list(BARE_METAL_FILL_RANGE_GBPS), "fill_threads": threads}


def machine_facts() -> dict[str, Any]:
    """What the host's numbers depend on: runtime and kernel, THP, the CPUs this process may
    use, its cgroup limits, and a fresh buffer's fill rate and page faults per stage."""
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    try:
        fill = fresh_fill_probe()
    except (RuntimeError, MemoryError) as exc:
        fill = {"unavailable": f"{type(exc).__name__}: {exc}"}
    return {"runtime": runtime_info(), "thp": thp_info(),
            "affinity": cpu_ranges(affinity) or None, "cgroup": cgroup_limits(),
            "fresh_fill": fill}


class PcieSampler:
    """Samples NVML's PCIe TX/RX throughput (KB/s over a 20 ms window) in a thread while a loop runs.

    A cross-check of what the copy loop really moved over the link. ``available`` is False, with
    ``reason``, where NVML cannot be read (no GPU, no driver) or the sampler itself failed part way
    (then the samples taken before the failure are dropped: a partial series would mislead).
    """

    def __init__(self, device_index: int = 0, interval_s: float = 0.02) -> None:
        self.device_index, self.interval_s = device_index, interval_s
        self.samples: list[tuple[float, int, int]] = []
        self.available, self.reason = False, ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PcieSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = nvml_handle(pynvml, self.device_index)
        except Exception as exc:  # ImportError or an NVMLError subclass
            self.reason = f"NVML cannot be read here ({type(exc).__name__}: {exc})"
            return self
        self.available = True
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        nvml, start = self._nvml, time.perf_counter()
        try:
            while not self._stop.is_set():
                tx = nvml.nvmlDeviceGetPcieThroughput(self._handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
                rx = nvml.nvmlDeviceGetPcieThroughput(self._handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
                self.samples.append((time.perf_counter() - start, tx * 1024, rx * 1024))
                self._stop.wait(self.interval_s)
        except Exception as exc:  # the sampler records its own failure instead of dying silently
            self.available, self.samples = False, []
            self.reason = f"the PCIe sampler failed ({type(exc).__name__}: {exc})"

    def __exit__(self, *_exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._nvml.nvmlShutdown()
