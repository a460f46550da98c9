"""What each optimizer keeps per trained parameter, in bytes, from the parameter's shape alone. No torch.

The counts follow the implementations gaplan builds (:mod:`gaplan.workload.optimizers`), read from their source:

* ``adamw`` (torch): two moments of the parameter's dtype. Its step counter, a 4-byte host scalar per parameter on
  CUDA, is left out, as it always was here.
* ``adamw-8bit`` and ``paged-adamw-8bit`` (bitsandbytes ``Optimizer2State``, checked against 0.50):
  a parameter of ``BNB_MIN_8BIT_SIZE`` elements or more keeps its two moments in one byte each (uint8) and one
  float32 absmax per block of ``BNB_BLOCK`` elements for each moment; a smaller one keeps two float32 moments.
  The two quantile maps (``BNB_QMAP_ENTRIES`` float32 each, signed and unsigned) are one pair per optimizer, shared
  by all its 8-bit parameters.
* ``adafactor`` (transformers, ``beta1=None``: no first moment): a matrix (2 dimensions or more) keeps its second
  moment factored, one float32 per row (``shape[:-1]``) and one per column (``shape[:-2] + shape[-1:]``); a vector
  keeps a full float32 second moment. Each parameter also keeps its RMS, a float32 scalar tensor.
* ``lion``: one momentum of the parameter's dtype.
* ``sgd`` (no momentum): nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from gaplan.workload.spec import ADAMW_IMPLEMENTATIONS

# bitsandbytes 0.50 optim/optimizer.py, Optimizer2State.init_state: ``blocksize = 256`` and the absmax buffers are
# ``torch.zeros((blocks,), dtype=torch.float32)``; ``min_8bit_size=4096`` is AdamW8bit's default; the maps are
# ``F.create_dynamic_map(signed=True/False)``, 256 float32 entries each. tests/workload/test_optimizers.py checks
# these against the installed version's real states.
BNB_BLOCK = 256
BNB_MIN_8BIT_SIZE = 4096
BNB_QMAP_ENTRIES = 256
FLOAT32 = 4
EIGHT_BIT = ("adamw-8bit", "paged-adamw-8bit")


def parameter_state_bytes(shape: Sequence[int], element_size: int, optimizer: str) -> int:
    """The bytes ``optimizer`` keeps for one trained parameter of ``shape`` and ``element_size`` (shared maps aside)."""
    numel = math.prod(shape)
    if optimizer in ADAMW_IMPLEMENTATIONS:
        return 2 * numel * element_size
    if optimizer in EIGHT_BIT:
        if numel < BNB_MIN_8BIT_SIZE:
            return 2 * numel * FLOAT32
        return 2 * numel + 2 * -(-numel // BNB_BLOCK) * FLOAT32
    if optimizer == "adafactor":
        if len(shape) >= 2:
            second = math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
        else:
            second = numel
        return (second + 1) * FLOAT32  # + the RMS scalar
    if optimizer == "lion":
        return numel * element_size
    return 0


def shared_state_bytes(numels: Iterable[int], optimizer: str) -> int:
    """The bytes one ``optimizer`` shares across its parameters: 8-bit AdamW's two quantile maps, once any parameter
    is large enough to be kept in 8 bits."""
    if optimizer in EIGHT_BIT and any(n >= BNB_MIN_8BIT_SIZE for n in numels):
        return 2 * BNB_QMAP_ENTRIES * FLOAT32
    return 0


def state_bytes(parameters: Sequence[tuple[Sequence[int], int]], optimizer: str) -> int:
    """The optimizer's state bytes over trained parameters given as ``(shape, element_size)``."""
    own = sum(parameter_state_bytes(shape, size, optimizer) for shape, size in parameters)
    return own + shared_state_bytes((math.prod(shape) for shape, _ in parameters), optimizer)
