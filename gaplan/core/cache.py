"""Where gaplan keeps what it can reuse between runs (probes, data lengths): one root for every cache."""

from __future__ import annotations

import os


def cache_root() -> str:
    """``$GAPLAN_CACHE_DIR``, else ``~/.cache/gaplan``."""
    return os.environ.get("GAPLAN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gaplan")
