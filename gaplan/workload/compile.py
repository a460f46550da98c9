"""``--compile``: the model compiled with ``torch.compile`` (inductor), in place, so a probe measures the compiled step.

Compilation changes what is saved for backward (fused kernels keep fewer intermediates, or others), so the
probe must run the compiled model to find its B*; the estimate traces it as inductor partitions it in one process
(over several ranks or with activation offloading, the eager model: gaplan.estimate.compiled), and says which. The model is
compiled with ``nn.Module.compile``, not wrapped: its ``state_dict`` keys stay the same, so a checkpoint loads
with or without ``--compile``. ``dynamic=True``: one graph for every micro-batch size, not a recompile per trial.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from gaplan.core.options import OptionError

if TYPE_CHECKING:
    import torch
    from torch import nn

CXX_NAMES = ("g++", "c++", "clang++")  # what inductor's CPU backend looks for, besides $CXX


def check_compiler(device: str) -> None:
    """A one-line error when ``torch.compile`` cannot build kernels for ``device`` (``cpu``, ``cuda:0``)."""
    if str(device).startswith("cuda"):
        from importlib import util

        if util.find_spec("triton") is None:
            raise OptionError("compile on CUDA needs triton for inductor's kernels: pip install triton, or leave "
                              "compile out", "compile")
        return
    names = (os.environ["CXX"],) if os.environ.get("CXX") else CXX_NAMES
    if not any(shutil.which(name) for name in names):
        raise OptionError(f"compile on the CPU needs a C++ compiler for inductor's kernels ({' or '.join(names)} not "
                          "found): install one (apt-get install g++), or leave compile out", "compile")


def compile_model(model: nn.Module, device: torch.device) -> None:
    """Compile ``model`` in place for ``device``; on the meta device (the estimate's build) it stays eager."""
    if device.type == "meta":
        return
    check_compiler(str(device))
    model.compile(dynamic=True)
