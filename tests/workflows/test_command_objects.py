"""Each command's object, built in Python (no command line), refuses what the CLI refuses, in the CLI's words, at
construction: before any model is built, any device is asked or anything is written."""

import pytest

import gaplan
from gaplan import BenchCommand, EstimateCommand, PlanCommand, ProbeCommand, TrainCommand, WorkloadSpec
from gaplan.benchmark.measurement import BenchSettings
from gaplan.data.source import DataSource
from gaplan.workflows.probe_settings import GoodputOptions, ProbeOptions

SPEC = WorkloadSpec(model="tiny-gpt2", seq_len=16)


@pytest.mark.parametrize("build, message", [
    (lambda out: ProbeCommand(SPEC, ProbeOptions(goodput=GoodputOptions(measure_steps=10)), out=out),
     "--measure-steps applies to --objective goodput"),
    (lambda out: ProbeCommand(SPEC, ProbeOptions(objective="goodput", report=True), out=out),
     "gaplan bench --plan OUT/plan.json"),
    (lambda out: ProbeCommand(SPEC, ProbeOptions(bench=BenchSettings(repeats=3)), out=out),
     "--repeats applies to --report, --objective throughput|goodput and --grad-checkpointing auto"),
    (lambda out: ProbeCommand(SPEC, source=DataSource(text_field="body"), out=out),
     "text_field applies to data"),
    (lambda out: ProbeCommand(SPEC, device="cpu", target="h100-80gb", out=out), "it needs a CUDA device"),
    (lambda out: BenchCommand(SPEC, world_size=2, out=out), "--world-size applies to --parallel fsdp here"),
    (lambda out: BenchCommand(SPEC, source=DataSource(path="x.txt"), out=out), "--data applies to --batch-by tokens"),
    (lambda out: EstimateCommand(SPEC, device="cpu", target="h100-80gb"), "does not go with --device cpu"),
    (lambda out: EstimateCommand(SPEC, sizes=(4,)), "--sizes needs at least two"),
    (lambda out: EstimateCommand(SPEC, device="cpu:0"), "--device must be auto, cpu, cuda or cuda:N"),  # not a GPU
    (lambda out: PlanCommand(SPEC, repeats=2, out=out), "--repeats applies to --measure"),
    (lambda out: PlanCommand(SPEC, threads=2, out=out), "--threads applies to --device cpu"),
    (lambda out: PlanCommand(SPEC, machinery="ddp", grad_sync="every", out=out), "--grad-sync applies to the FSDP"),
    (lambda out: TrainCommand(SPEC, token_plan="tokens.json", out=out), "--token-plan needs --batch-by tokens"),
    (lambda out: TrainCommand(SPEC, resume="reports/run", out=out), "a resumed run goes on in its own folder"),
    # What a Python caller may give that the command line never does: checked at construction as the flags are
    (lambda out: ProbeCommand(SPEC, memory_limit=-1, out=out), "memory_limit must be a positive integer"),
    (lambda out: ProbeCommand(SPEC, device="tpu", out=out), "--device must be auto, cpu, cuda or cuda:N"),
    (lambda out: ProbeCommand(SPEC, emit="bogus", out=out), "emit must be one of hf"),
    (lambda out: ProbeCommand("tiny-gpt2", out=out), "spec must be a WorkloadSpec"),
    (lambda out: BenchCommand(WorkloadSpec(model="tiny-gpt2", optimizer="bogus"), out=out), "unknown optimizer 'bogus'"),
    (lambda out: PlanCommand(SPEC, device="tpu", out=out), "device must be one of cuda, cpu"),
])
def test_a_command_object_built_in_python_refuses_as_the_cli_does(build, message, tmp_path):
    with pytest.raises(gaplan.GaplanError, match=message.replace("|", r"\|").replace("(", r"\(")):
        build(str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_command_object_names_its_run_folder_once():
    command = PlanCommand(SPEC, device="cpu")
    assert command.out.startswith("reports/plan-tiny-gpt2-") and command.ranks == 1 and command.layouts


# NVIDIA's tensor cores compute in bf16 from Ampere (compute capability 8.0) on; Volta (V100, 7.0) and Turing (T4,
# 7.5) have none: bf16 runs emulated there, and people train those cards in fp16.
CARDS_WITHOUT_BF16 = {"v100-16gb", "v100-32gb", "t4"}


def test_a_size_as_text_is_read_as_the_flag_reads_it(tmp_path):
    assert ProbeCommand(SPEC, memory_limit="256MiB", out=str(tmp_path)).memory_limit == 256 * 2**20


def test_plans_dtype_auto_is_bf16_but_fp16_on_a_card_without_bf16(tmp_path):
    from gaplan.estimate import list_targets

    out = str(tmp_path / "out")
    for target in list_targets():
        command = PlanCommand(SPEC, target=target.name, out=out)
        assert command.spec.dtype == ("fp16" if target.name in CARDS_WITHOUT_BF16 else "bf16"), target.name
    assert PlanCommand(SPEC, target="v100", dtype="bf16", out=out).spec.dtype == "bf16"  # given: kept
    assert PlanCommand(SPEC, target="t4", dtype="fp32", out=out).spec.dtype == "fp32"
    assert PlanCommand(SPEC, out=out).spec.dtype == "bf16"  # the default target, an H100
    assert PlanCommand(SPEC, memory_limit=2**34, out=out).spec.dtype == "bf16"  # a budget names no card
    with pytest.raises(gaplan.GaplanError, match="^dtype must be one of auto, bf16, fp16, fp32"):
        PlanCommand(SPEC, dtype="float16", out=out)


def test_a_checked_command_object_can_be_replaced_and_is_checked_again(tmp_path):
    import dataclasses

    out = str(tmp_path / "out")
    probe = ProbeCommand(SPEC, out=out)
    assert dataclasses.replace(probe, device="cpu").granule is None  # the default stays "not given"
    bench = BenchCommand(SPEC, out=out)
    assert dataclasses.replace(bench, settings=BenchSettings(repeats=3)).settings.repeats == 3
    with pytest.raises(gaplan.GaplanError, match="^granule applies to batch_by tokens"):
        dataclasses.replace(probe, granule=32)


def test_a_bench_by_tokens_runs_any_number_of_rounds_and_keeps_a_callers_settings(tmp_path):
    """Its --rounds is a fixed number (one, or more than a bench by samples' --max-rounds); by samples, a
    caller's BenchSettings(large_batch=False) stays so."""
    data = tmp_path / "corpus.txt"
    data.write_text("a line of text\n" * 8)
    for rounds in (1, 20):
        bench = BenchCommand(SPEC, batch_by="tokens", source=DataSource(path=str(data)),
                             settings=BenchSettings(min_rounds=rounds), out=str(tmp_path / "out"))
        assert bench.settings.min_rounds == rounds
    with pytest.raises(gaplan.GaplanError, match="max_rounds .10. must be at least rounds .20."):
        BenchCommand(SPEC, settings=BenchSettings(min_rounds=20), out=str(tmp_path / "out"))
    alone = BenchCommand(SPEC, settings=BenchSettings(large_batch=False), out=str(tmp_path / "out"))
    assert not alone.settings.large_batch
    assert not BenchCommand(SPEC, no_large_batch=True, out=str(tmp_path / "out")).settings.large_batch
