"""The plan cache: where it lives (``GAPLAN_CACHE_DIR``), what its key holds, and when a cached probe is reused."""

import dataclasses
import json
import os

import pytest

import gaplan.probing.edge
from gaplan.core.checkpointing import ON, parse_checkpointing
from gaplan.core.trial import Trial
from gaplan.plan.split import make_plan
from gaplan.probing.cache import plan_cache_path, probe_for
from gaplan.runs.probe_result import ProbeResult, load_probe, save_probe
from gaplan.workload.spec import WorkloadSpec
from tests.conftest import SMALL_BUDGET

SPEC = WorkloadSpec(model="tiny-gpt2", seq_len=16)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GAPLAN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_gaplan_cache_dir_moves_the_cache(cache_dir, monkeypatch, tmp_path):
    path = plan_cache_path(SPEC, "cpu", SMALL_BUDGET)
    assert os.path.commonpath([path, str(cache_dir)]) == str(cache_dir)
    monkeypatch.setenv("GAPLAN_CACHE_DIR", str(tmp_path / "elsewhere"))
    moved = plan_cache_path(SPEC, "cpu", SMALL_BUDGET)
    assert moved.startswith(str(tmp_path / "elsewhere") + os.sep)
    assert os.path.basename(moved) == os.path.basename(path)  # the same key, another place
    monkeypatch.delenv("GAPLAN_CACHE_DIR")
    assert plan_cache_path(SPEC, "cpu", SMALL_BUDGET).startswith(os.path.expanduser("~"))


def test_the_key_holds_what_changes_memory_and_nothing_else(tmp_path):
    base = plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=2)
    others = {
        "threads": plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=1),
        "no threads": plan_cache_path(SPEC, "cpu", SMALL_BUDGET),
        "budget": plan_cache_path(SPEC, "cpu", 2 * SMALL_BUDGET, threads=2),
        "default budget": plan_cache_path(SPEC, "cpu", None, threads=2),
        "device": plan_cache_path(SPEC, "cuda:0", SMALL_BUDGET, threads=2),
        "seq len": plan_cache_path(dataclasses.replace(SPEC, seq_len=32), "cpu", SMALL_BUDGET, threads=2),
        "dtype": plan_cache_path(dataclasses.replace(SPEC, dtype="bf16"), "cpu", SMALL_BUDGET, threads=2),
        "optimizer": plan_cache_path(dataclasses.replace(SPEC, optimizer="sgd"), "cpu", SMALL_BUDGET, threads=2),
        "checkpointing": plan_cache_path(dataclasses.replace(SPEC, grad_checkpointing=ON), "cpu", SMALL_BUDGET,
                                         threads=2),
        "every:2": plan_cache_path(dataclasses.replace(SPEC, grad_checkpointing=parse_checkpointing("every:2")), "cpu",
                                   SMALL_BUDGET, threads=2),
        "compile": plan_cache_path(dataclasses.replace(SPEC, compile=True), "cpu", SMALL_BUDGET, threads=2),
        "model": plan_cache_path(dataclasses.replace(SPEC, model="tiny-llama"), "cpu", SMALL_BUDGET, threads=2),
    }
    for what, path in others.items():
        assert path != base, what
    assert len(set(others.values())) == len(others)
    assert plan_cache_path(dataclasses.replace(SPEC, lr=0.123), "cpu", SMALL_BUDGET, threads=2) == base
    assert plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=2) == base  # deterministic


def test_a_model_folder_whose_config_changes_is_another_workload(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 300}
    (folder / "config.json").write_text(json.dumps(config))
    spec = WorkloadSpec(model=str(folder), seq_len=16)
    first = plan_cache_path(spec, "cpu", SMALL_BUDGET)
    (folder / "weights.bin").write_bytes(b"not part of the key")  # weights do not change memory
    assert plan_cache_path(spec, "cpu", SMALL_BUDGET) == first
    (folder / "config.json").write_text(json.dumps(dict(config, n_layer=2)))
    second = plan_cache_path(spec, "cpu", SMALL_BUDGET)
    assert second != first
    (folder / "generation_config.json").write_text("{}")
    assert plan_cache_path(spec, "cpu", SMALL_BUDGET) not in (first, second)


def probe_result(max_micro_batch: int, capped: bool = False, effective_batch: int = 64) -> ProbeResult:
    fits = [Trial(size, True, 100 * 2**20 + size * 2**20) for size in (1, 2, max_micro_batch)]
    trials = fits if capped else [*fits, Trial(max_micro_batch + 1, False, error="can't allocate memory")]
    return ProbeResult(workload=SPEC, device="cpu", memory_limit_bytes=SMALL_BUDGET, margin=0.0,
                       probe_limit_bytes=SMALL_BUDGET, budget_is_default=False, max_micro_batch=max_micro_batch,
                       capped=capped, trials=trials, plan=make_plan(effective_batch, max_micro_batch),
                       param_count=5_500_000, static_bytes=84 * 2**20, task="causal-lm", seq_len=16, wall_seconds=1.0)


@pytest.fixture
def stand_in_probe(monkeypatch):
    """Records the calls ``probe_for`` makes to the probe and answers B* = 11.

    A stand-in is right here: these tests are about the cache glue around the probe, not the probe
    (the real probe has its own tests); a real one would take a minute per call.
    """
    calls = []

    def fake_probe(spec, device="auto", memory_limit=None, effective_batch=256, threads=None, **_):
        calls.append(dict(spec=spec, device=device, memory_limit=memory_limit, effective_batch=effective_batch,
                          threads=threads))
        return dataclasses.replace(probe_result(11, effective_batch=effective_batch), workload=spec)

    monkeypatch.setattr(gaplan.probing.edge, "probe", fake_probe)
    return calls


def test_probe_for_reuses_the_cached_probe_of_the_same_workload_only(stand_in_probe):
    cached = probe_result(37)
    save_probe(cached, plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=2))

    _, reused = probe_for(SPEC, "cpu", SMALL_BUDGET, 64, threads=2)
    assert reused.max_micro_batch == 37 and not stand_in_probe
    _, reused = probe_for(dataclasses.replace(SPEC, lr=0.5), "cpu", SMALL_BUDGET, 64, threads=2)
    assert reused.max_micro_batch == 37 and not stand_in_probe  # another learning rate: the same memory

    _, fresh = probe_for(SPEC, "cpu", SMALL_BUDGET, 64, threads=1)
    assert fresh.max_micro_batch == 11
    assert len(stand_in_probe) == 1 and stand_in_probe[0]["threads"] == 1
    assert stand_in_probe[0]["memory_limit"] == SMALL_BUDGET and stand_in_probe[0]["effective_batch"] == 64
    # The new probe is cached under its own key; the other entry is untouched.
    _, again = probe_for(SPEC, "cpu", SMALL_BUDGET, 64, threads=1)
    assert again.max_micro_batch == 11 and len(stand_in_probe) == 1
    _, still = probe_for(SPEC, "cpu", SMALL_BUDGET, 64, threads=2)
    assert still.max_micro_batch == 37


def test_a_capped_probe_is_reused_only_when_its_cap_covers_the_need(stand_in_probe):
    save_probe(probe_result(8, capped=True, effective_batch=8), plan_cache_path(SPEC, "cpu", SMALL_BUDGET))
    _, reused = probe_for(SPEC, "cpu", SMALL_BUDGET, 8)
    assert reused.max_micro_batch == 8 and not stand_in_probe
    _, fresh = probe_for(SPEC, "cpu", SMALL_BUDGET, 64)  # stopped at 8, but up to 64 may be of use now
    assert fresh.max_micro_batch == 11 and len(stand_in_probe) == 1
    assert stand_in_probe[0]["effective_batch"] == 64


def test_write_cache_false_leaves_no_entry(stand_in_probe):
    probe_for(SPEC, "cpu", SMALL_BUDGET, 64, write_cache=False)
    assert not os.path.exists(plan_cache_path(SPEC, "cpu", SMALL_BUDGET))
    probe_for(SPEC, "cpu", SMALL_BUDGET, 64)
    assert len(stand_in_probe) == 2 and os.path.isfile(plan_cache_path(SPEC, "cpu", SMALL_BUDGET))


def test_a_damaged_entry_is_probed_again_and_replaced_and_an_unwritable_cache_is_only_said(stand_in_probe, tmp_path,
                                                                                             monkeypatch):
    """A truncated entry blocked every train of the workload ("cannot read plan file <cache>"), and a cache that
    could not be written failed the train after its probe (a traceback where GAPLAN_CACHE_DIR is a file)."""
    cache = plan_cache_path(SPEC, "cpu", SMALL_BUDGET)
    save_probe(probe_result(37), cache)
    with open(cache, "r+") as handle:
        handle.truncate(300)
    said = []
    _, fresh = probe_for(SPEC, "cpu", SMALL_BUDGET, 64, say=said.append)
    assert fresh.max_micro_batch == 11 and len(stand_in_probe) == 1
    assert any(line.startswith("the cached probe cannot be read (") and "probing again, and replacing it" in line
               for line in said), said
    _, again = probe_for(SPEC, "cpu", SMALL_BUDGET, 64)
    assert again.max_micro_batch == 11 and len(stand_in_probe) == 1  # the entry was replaced
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("GAPLAN_CACHE_DIR", str(tmp_path / "a-file"))
    said.clear()
    _, probed = probe_for(SPEC, "cpu", SMALL_BUDGET, 64, say=said.append)
    assert probed.max_micro_batch == 11 and any(line.startswith("the probe is not cached (") for line in said), said


FSDP = dataclasses.replace(SPEC, parallel="fsdp")


def test_the_key_holds_the_layout_and_a_sharded_runs_world_size():
    """FSDP's shards (so its B*) depend on the layout and the world size; a replicated run's trials do not."""
    keys = {
        "ddp": plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=1),
        "ddp wrapper": plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=1, ddp=True),
        "fsdp 2": plan_cache_path(FSDP, "cpu", SMALL_BUDGET, threads=1, world_size=2),
        "fsdp 4": plan_cache_path(FSDP, "cpu", SMALL_BUDGET, threads=1, world_size=4),
        "fsdp 2 offload": plan_cache_path(dataclasses.replace(FSDP, cpu_offload=True), "cpu", SMALL_BUDGET, threads=1,
                                          world_size=2),
        "fsdp 2 sync every": plan_cache_path(dataclasses.replace(FSDP, grad_sync="every"), "cpu", SMALL_BUDGET,
                                             threads=1, world_size=2),
    }
    assert len(set(keys.values())) == len(keys), keys
    assert plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=1, world_size=4) == keys["ddp"]
    # A sharded run's trials run every rank, each without a DDP wrapper: the flag is no part of its key.
    assert plan_cache_path(FSDP, "cpu", SMALL_BUDGET, threads=1, ddp=True, world_size=2) == keys["fsdp 2"]


def test_probe_for_a_sharded_run_probes_its_world_size_and_caches_per_world_size(monkeypatch):
    calls = []

    def fake_probe(spec, **options):
        calls.append(options)
        world = options["world_size"]
        return dataclasses.replace(probe_result(9, effective_batch=options["effective_batch"]), workload=spec,
                                   plan=make_plan(options["effective_batch"], 9, world), world_size=world,
                                   trial_ranks=world)

    monkeypatch.setattr(gaplan.probing.edge, "probe", fake_probe)
    _, probed = probe_for(FSDP, "cpu", SMALL_BUDGET, 32, threads=1, world_size=2, ddp=True)
    assert calls[-1]["world_size"] == 2 and calls[-1]["search_cap"] == 32 and calls[-1]["effective_batch"] == 64
    assert probed.world_size == 2 and os.path.isfile(plan_cache_path(FSDP, "cpu", SMALL_BUDGET, 1, world_size=2))
    probe_for(FSDP, "cpu", SMALL_BUDGET, 32, threads=1, world_size=2)
    assert len(calls) == 1  # cached
    monkeypatch.setenv("WORLD_SIZE", "4")  # under torchrun, without an explicit world size
    probe_for(FSDP, "cpu", SMALL_BUDGET, 32, threads=1)
    assert len(calls) == 2 and calls[-1]["world_size"] == 4


def test_a_plan_file_of_another_layout_or_world_size_is_refused(tmp_path):
    from gaplan.core.errors import GaplanError

    ddp_plan = tmp_path / "ddp.json"
    save_probe(probe_result(9), str(ddp_plan))
    with pytest.raises(GaplanError, match="--parallel ddp"):
        probe_for(FSDP, "cpu", SMALL_BUDGET, 32, plan_file=str(ddp_plan), world_size=2)
    fsdp_plan = tmp_path / "fsdp.json"
    save_probe(dataclasses.replace(probe_result(9), workload=FSDP, plan=make_plan(64, 9, 2), world_size=2,
                                   trial_ranks=2), str(fsdp_plan))
    _, probed = probe_for(FSDP, "cpu", SMALL_BUDGET, 32, plan_file=str(fsdp_plan), world_size=2)
    assert probed.world_size == 2 and probed.trial_ranks == 2 and probed.workload.parallel == "fsdp"
    with pytest.raises(GaplanError, match="probed for FSDP over 2 ranks, not 4"):
        probe_for(FSDP, "cpu", SMALL_BUDGET, 32, plan_file=str(fsdp_plan), world_size=4)


def test_a_reused_probe_names_its_cache_file_key_and_date(stand_in_probe, tmp_path):
    """The run's plan.json (and so its report) says the probe came from the cache, not only stderr."""
    cached = dataclasses.replace(probe_result(37), created="2026-01-02T03:04:05+00:00")
    path = plan_cache_path(SPEC, "cpu", SMALL_BUDGET, threads=2)
    save_probe(cached, path)
    _, reused = probe_for(SPEC, "cpu", SMALL_BUDGET, 64, threads=2)
    key = os.path.splitext(os.path.basename(path))[0]
    assert reused.reused_probe == {"path": path, "key": key, "created": "2026-01-02T03:04:05+00:00"}
    assert reused.created != cached.created  # the run's own date; the probe's is in reused_probe
    save_probe(reused, str(tmp_path / "plan.json"))
    assert load_probe(str(tmp_path / "plan.json")).reused_probe == reused.reused_probe
    _, fresh = probe_for(SPEC, "cpu", SMALL_BUDGET, 64, threads=1)
    assert fresh.reused_probe is None and "reused_probe" not in fresh.to_dict()
