"""Probe a token budget: the exact sample edge at the data's shortest and longest lengths, then T*."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gaplan.core.trial import Trial
from gaplan.plan.tokens import (
    LONG_SEARCH_CAP,
    LengthProfile,
    TokenBudget,
    budget_from_edges,
    check_granule,
    short_search_cap,
)
from gaplan.runs.probe_result import ProbeResult
from gaplan.workload.spec import WorkloadSpec


def probe_token_budget(spec: WorkloadSpec, profile: LengthProfile, device: str, memory_limit: int | None,
                       granule: int, *, threads: int | None = None, ddp: bool = False, world_size: int | None = None,
                       write_cache: bool = True, say: Callable[[str], None] = lambda text: None,
                       on_trial: Callable[[Trial], None] | None = None
                       ) -> tuple[TokenBudget, ProbeResult, ProbeResult | None]:
    """T* for data of ``profile``'s lengths, the probe at the longest length (the run's sample plan), and the one at
    the shortest (None when every sample has one length).

    Two probes of the workload at sequence lengths ``profile.longest`` and ``profile.shortest``
    (each cached as any probe is); the second searches only as far as the first makes useful.
    """
    from gaplan.probing.cache import probe_for

    check_granule(granule)  # before any trial
    common = dict(threads=threads, ddp=ddp, world_size=world_size, write_cache=write_cache, say=say,
                  on_trial=on_trial)
    say(f"token budget: probing {profile.longest}-token samples (the longest) ...")
    _, long_probe = probe_for(dataclasses.replace(spec, seq_len=profile.longest), device, memory_limit,
                              LONG_SEARCH_CAP, **common)
    long_edge = long_probe.max_micro_batch
    short_edge, short_probe = long_edge, None
    if profile.shortest < profile.longest:
        cap = short_search_cap(profile.longest, long_edge, profile.shortest)
        say(f"token budget: probing {profile.shortest}-token samples (the shortest), up to {cap} of them ...")
        _, short_probe = probe_for(dataclasses.replace(spec, seq_len=profile.shortest), device, memory_limit,
                                   cap, **common)
        short_edge = short_probe.max_micro_batch
    budget = budget_from_edges(profile.shortest, short_edge, profile.longest, long_edge, granule)
    return budget, long_probe, short_probe
