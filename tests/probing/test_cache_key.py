"""The probe cache's key holds the machine: the device's model, memory, compute capability and driver, the
libraries' versions and (on CUDA) the allocator's setting; each one alone makes another key, and the reuse line
says what matched.

The card is a stand-in here (no GPU): :func:`gaplan.devices.card.cuda_cards`' once-per-process answer, replaced by
``CudaCards`` values that differ in one field at a time. The CPU's fields and the versions are this machine's own,
read here a second way, and each is then changed alone through the function that reads it.
"""

from __future__ import annotations

import dataclasses
from importlib import metadata

import pytest

import gaplan.probing.edge
from gaplan.devices import card, identity
from gaplan.devices.card import CudaCards
from gaplan.devices.identity import LIBRARIES, machine_identity
from gaplan.probing.cache import plan_cache_path, probe_for
from gaplan.runs.probe_result import save_probe
from gaplan.workload.spec import WorkloadSpec
from tests.conftest import SMALL_BUDGET

GiB = 2**30
SPEC = WorkloadSpec(model="tiny-gpt2", seq_len=16)
A100 = CudaCards(("NVIDIA A100-SXM4-40GB",), (40 * GiB,), (39 * GiB,), "12.8", ("8.0",), "550.54.15")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("GAPLAN_CACHE_DIR", str(tmp_path / "cache"))
    for name in identity.ALLOCATOR_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(card, "_asked", A100)  # the card as a child would have answered


def test_the_cpus_identity_is_this_machines():
    me = machine_identity("cpu")
    with open("/proc/cpuinfo") as cpuinfo:
        names = {line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")}
    with open("/proc/meminfo") as meminfo:
        total = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:"))
    assert me.model in names and abs(me.total_bytes - total) < 2**20  # MemTotal is rounded to KiB
    assert me.capability is None and me.driver is None and me.allocator is None
    for name, version in me.libraries:
        try:
            assert version == metadata.version(name)
        except metadata.PackageNotFoundError:
            assert version is None
    assert [name for name, _ in me.libraries] == list(LIBRARIES)


def test_a_cards_identity_comes_from_the_cards_answers():
    me = machine_identity("cuda:0")
    assert (me.model, me.total_bytes, me.capability, me.driver) == ("NVIDIA A100-SXM4-40GB", 40 * GiB, "8.0",
                                                                      "550.54.15")
    assert me.allocator == ()  # nothing set: torch's defaults, recorded as such
    gone = machine_identity("cuda:1")  # not here: the fields are unknown, the key still made (the probe fails)
    assert (gone.model, gone.total_bytes, gone.capability, gone.driver) == (None,) * 4


def _cuda_key() -> str:
    return plan_cache_path(SPEC, "cuda:0", None, threads=1)


@pytest.mark.parametrize("field, value", [
    ("names", ("NVIDIA H100 80GB HBM3",)),
    ("total_bytes", (80 * GiB,)),
    ("capabilities", ("9.0",)),
    ("driver_version", "570.86.10"),
])
def test_each_card_field_alone_makes_another_key(monkeypatch, field, value):
    base = _cuda_key()
    monkeypatch.setattr(card, "_asked", dataclasses.replace(A100, **{field: value}))
    assert _cuda_key() != base
    monkeypatch.setattr(card, "_asked", dataclasses.replace(A100, free_bytes=(1 * GiB,), cuda_version="12.4"))
    assert _cuda_key() == base  # free memory at the time of asking, and the build's CUDA, are not the card


@pytest.mark.parametrize("library", LIBRARIES)
def test_each_librarys_version_alone_makes_another_key(monkeypatch, library):
    keys = {device: plan_cache_path(SPEC, device, SMALL_BUDGET, threads=1) for device in ("cpu", "cuda:0")}
    real = metadata.version

    def version(name: str) -> str:
        return "99.0" if name == library else real(name)

    monkeypatch.setattr(identity.metadata, "version", version)
    for device, key in keys.items():
        assert plan_cache_path(SPEC, device, SMALL_BUDGET, threads=1) != key, device


@pytest.mark.parametrize("field", ["model", "total_bytes"])
def test_each_cpu_field_alone_makes_another_key(monkeypatch, field):
    base = plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=1)
    if field == "model":
        monkeypatch.setattr(identity, "cpu_model", lambda: "another processor")
    else:
        monkeypatch.setattr(identity, "total_memory_bytes", lambda: 2 * GiB)
    assert plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=1) != base


@pytest.mark.parametrize("variable", identity.ALLOCATOR_VARIABLES)
def test_the_allocator_setting_alone_makes_another_cuda_key_and_no_other_cpu_key(monkeypatch, variable):
    cuda, cpu = _cuda_key(), plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=1)
    monkeypatch.setenv(variable, "expandable_segments:True")
    expandable = _cuda_key()
    monkeypatch.setenv(variable, "garbage_collection_threshold:0.6,max_split_size_mb:128")
    assert len({cuda, expandable, _cuda_key()}) == 3
    assert plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=1) == cpu  # torch's CPU allocator does not read it


def test_the_reuse_line_says_what_matched(monkeypatch):
    from tests.probing.test_cache import probe_result

    monkeypatch.setattr(gaplan.probing.edge, "probe", lambda *a, **k: pytest.fail("the cached probe was not used"))
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    lines: list[str] = []
    for device in ("cpu", "cuda:0"):
        path = plan_cache_path(SPEC, device, SMALL_BUDGET, threads=2)
        save_probe(dataclasses.replace(probe_result(37), device=device), path)
        probe_for(SPEC, device, SMALL_BUDGET, 64, threads=2, say=lines.append)
        assert lines[-1].startswith(f"using the cached probe {path}: largest micro-batch 37 (matched: the workload, "
                                    "budget 256.00 MiB, threads 2; ")
    cpu, cuda = lines
    me = machine_identity("cpu")
    assert f"cpu {me.model}" in cpu and "PYTORCH_CUDA_ALLOC_CONF" not in cpu
    assert ("cuda:0 NVIDIA A100-SXM4-40GB, 40.00 GiB, compute 8.0, driver 550.54.15; " in cuda
            and cuda.endswith("; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"))
    for line in lines:
        assert "\n" not in line
        assert all(f"{name} {version or 'absent'}" in line for name, version in me.libraries)


def test_the_driver_version_comes_from_nvml_else_the_driver_api(monkeypatch):
    """``driver_version`` (run in the card's child) with stand-ins for NVML and libcuda, and with neither."""
    import ctypes

    class Nvml:
        def nvmlInit_v2(self):
            return 0

        def nvmlSystemGetDriverVersion(self, text, length):
            ctypes.memmove(text, b"550.54.15\0", 10)
            return 0

        def nvmlShutdown(self):
            return 0

    class Cuda:
        def cuDriverGetVersion(self, pointer):
            ctypes.cast(pointer, ctypes.POINTER(ctypes.c_int))[0] = 12040
            return 0

    def library(libraries):
        def load(name):
            if name not in libraries:
                raise OSError(f"{name}: cannot open shared object file")
            return libraries[name]

        return load

    monkeypatch.setattr(ctypes, "CDLL", library({"libnvidia-ml.so.1": Nvml(), "libcuda.so.1": Cuda()}))
    assert card.driver_version() == "550.54.15"
    monkeypatch.setattr(ctypes, "CDLL", library({"libcuda.so.1": Cuda()}))
    assert card.driver_version() == "CUDA driver 12.4"
    monkeypatch.setattr(ctypes, "CDLL", library({}))
    assert card.driver_version() is None

