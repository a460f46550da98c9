"""Devices: the CPU budget and peak (:mod:`~gaplan.devices.cpu`), CUDA (:mod:`~gaplan.devices.cuda`),
MKL's GEMM workspace (:mod:`~gaplan.devices.mkl`), and choosing a backend (:mod:`~gaplan.devices.backend`)."""

from gaplan.core.lazy import lazy_exports

_EXPORTS = {
    "Backend": ".backend",
    "is_out_of_memory": ".backend",
    "make_backend": ".backend",
    "release_after_oom": ".backend",
    "resolve_device": ".backend",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
