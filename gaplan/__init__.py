"""gaplan: find the largest micro-batch that fits, plan gradient accumulation, train with the exact loss."""

from gaplan.errors import DoesNotFit, GaplanError
from gaplan.plan import Plan, make_plan, split_evenly
from gaplan.search import SearchResult, find_edge, trial_bound

__version__ = "0.1.0"

__all__ = [
    "DoesNotFit",
    "GaplanError",
    "Plan",
    "SearchResult",
    "__version__",
    "find_edge",
    "make_plan",
    "split_evenly",
    "trial_bound",
]
