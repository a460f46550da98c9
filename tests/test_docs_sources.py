"""The constants the docs quote, read from the code that uses them: the CUDA allowances (the context, cuBLAS's
workspaces, NCCL's buffers), the caching allocator's sizes, the CPU heap line, the lever table's cost model (the
rates and the optimizer passes), the pick's tie and the lever rows' counts, the trust lines, and the sums the pages
draw from their own tables. Each test reads the claim out of its page, so editing either the page or the code
alone fails here. No torch and no model: a few milliseconds."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MiB = 2**20


def flat(name: str) -> str:
    return " ".join((ROOT / name).read_text().split())


def mib(value: int) -> str:
    return f"{value / MiB:g} MiB"


# ---- the CUDA allowances: estimate.md, gpu.md, probe.md -------------------------------------------------------------


def test_the_cuda_allowances_are_the_codes():
    from gaplan.devices.reserve import CONTEXT_BYTES, NCCL_BUFFSIZE, NCCL_MAX_CHANNELS, NCCL_RING_PEERS, nccl_buffer_bytes
    from gaplan.estimate.device import WORKSPACE_BYTES_HOPPER, WORKSPACE_BYTES_OTHER

    estimate = flat("docs/estimate.md")
    assert (f"the CUDA context's allowance ({mib(CONTEXT_BYTES)}, `CONTEXT_BYTES` in `gaplan/devices/reserve.py`)"
            in estimate)
    assert (f"({mib(WORKSPACE_BYTES_HOPPER)} on Hopper, {round(WORKSPACE_BYTES_OTHER / MiB)} MiB elsewhere: "
            f"`WORKSPACE_BYTES_HOPPER` and `WORKSPACE_BYTES_OTHER` in `gaplan/estimate/device.py`" in estimate)
    gpu = flat("docs/gpu.md")
    assert f"against the allowance `CONTEXT_BYTES` ({mib(CONTEXT_BYTES)}, `gaplan/devices/reserve.py`)" in gpu
    assert f"the allowance `nccl_buffer_bytes(2)` ({mib(nccl_buffer_bytes(2, {}))}, `gaplan/devices/reserve.py`" in gpu
    assert f"`CONTEXT_BYTES` ({mib(CONTEXT_BYTES)};" in gpu
    assert (f"(NCCL_BUFFSIZE, {mib(NCCL_BUFFSIZE)} by default per NCCL's documentation, x {NCCL_MAX_CHANNELS} channels "
            f"at most x {NCCL_RING_PEERS} ring peers: {mib(nccl_buffer_bytes(2, {}))} above one rank" in gpu)
    assert f"less the {mib(CONTEXT_BYTES)} context allowance" in flat("docs/probe.md")


def test_the_context_allowances_sources_are_the_ones_the_code_quotes():
    """gpu.md's "300-600 MiB" and "723 and ~800 MiB" are the published figures `gaplan/devices/reserve.py` names, not a
    measurement of ours (no GPU has run the checks)."""
    import gaplan.devices.reserve as reserve

    source = " ".join(reserve.__doc__.split())
    gpu = flat("docs/gpu.md")
    low, high = re.search(r"a CUDA 12 context at (\d+)-(\d+) MiB", gpu).groups()
    assert f"typically {low}-{high} MiB" in source
    first, second = re.search(r"threads quoted there measured (\d+) and ~(\d+) MiB", gpu).groups()
    assert f"({first} MiB)" in source and f"(~{second} MiB)" in source


def test_the_gpu_checks_time_limit_is_the_scripts():
    script = (ROOT / "tests" / "gpu" / "gpu_check.sh").read_text()
    limit = int(re.search(r"^limit=(\d+)$", script, re.M).group(1))
    assert f"The run stops after {limit} s" in flat("docs/gpu.md")


def test_no_gpu_measurement_is_claimed():
    """No GPU has run tests/gpu/gpu_check.sh: the page says so, and quotes no measured table."""
    gpu = (ROOT / "docs" / "gpu.md").read_text()
    section = gpu.split("## Measured on a GPU", 1)[1].split("\n## ", 1)[0]
    assert section.strip().startswith("Not yet.")
    assert "| pass |" not in gpu and "| fail |" not in gpu


# ---- the caching allocator: estimate.md and gpu.md ------------------------------------------------------------------


def test_the_allocators_sizes_are_the_codes():
    from gaplan.estimate.allocator import (
        CUDA_BLOCK,
        CUDA_LARGE_ALLOC,
        CUDA_MID_SEGMENT,
        CUDA_ROUND_LARGE,
        CUDA_SMALL_SEGMENT,
        CUDA_SMALL_SIZE,
    )

    estimate = flat("docs/estimate.md")
    assert f"A request is rounded up to {CUDA_BLOCK} B" in estimate
    assert (f"(at least {CUDA_BLOCK} B in the small pool, more than {mib(CUDA_SMALL_SIZE)} in the large one)"
            in estimate)
    assert (f"blocks of {mib(CUDA_SMALL_SIZE)} or less share {mib(CUDA_SMALL_SEGMENT)} segments, blocks under "
            f"{mib(CUDA_LARGE_ALLOC)} share {mib(CUDA_MID_SEGMENT)} segments, and a block of {mib(CUDA_LARGE_ALLOC)} "
            f"or more is its own segment, rounded up to {mib(CUDA_ROUND_LARGE)}" in estimate)
    gpu = flat("docs/gpu.md")
    assert (f"blocks of {mib(CUDA_SMALL_SIZE)} or less share {mib(CUDA_SMALL_SEGMENT)} segments, blocks under "
            f"{mib(CUDA_LARGE_ALLOC)} share {mib(CUDA_MID_SEGMENT)} ones, larger blocks are their own segment rounded "
            f"to {mib(CUDA_ROUND_LARGE)}" in gpu)


def test_the_unfilled_segments_figure_is_the_same_on_both_pages():
    """The 24.3 MiB is re-traced by tests/test_docs_estimate.py (heavy); the two pages quote one figure."""
    shown = re.search(r"tiny-gpt2 at seq 32 on a 1 GiB card, `--memory-limit 1GiB`: ([\d.]+) MiB",
                      flat("docs/estimate.md")).group(1)
    assert f"the estimate adds {shown} MiB on tiny-gpt2 at seq 32" in flat("docs/gpu.md")


# ---- the CPU model: estimate.md -------------------------------------------------------------------------------------


def test_the_cpu_heap_line_is_the_codes():
    from gaplan.estimate.device import CPU_HEAP_BYTES, CPU_HEAP_BYTES_PER_NODE

    assert (f"adds {CPU_HEAP_BYTES / MiB:.2f} MiB + {CPU_HEAP_BYTES_PER_NODE / 1024:.1f} KiB a node (`CPU_HEAP_BYTES` "
            f"and `CPU_HEAP_BYTES_PER_NODE` in `gaplan/estimate/device.py`" in flat("docs/estimate.md"))


# ---- the zoo and the trust line: estimate.md ------------------------------------------------------------------------


def _zoo_rows() -> list[tuple[str, str, float, float, float, float]]:
    text = (ROOT / "docs" / "estimate.md").read_text().split("## The zoo", 1)[1]
    rows = re.findall(r"^\| (\w+)[^|]* \| (full|LoRA) \| ([+-][\d.]+)% \| ([+-][\d.]+)% \| ([\d.]+) vs ([\d.]+) \|$",
                      text, re.M)
    return [(family, kind, float(small), float(large), float(estimated), float(measured))
            for family, kind, small, large, estimated, measured in rows]


def test_the_zoo_summary_is_its_table():
    from gaplan.estimate.trust import ZOO_ERRORS

    rows = _zoo_rows()
    assert len(rows) == 2 * len(ZOO_ERRORS)
    text = flat("docs/estimate.md")
    family, kind, small, *_ = max(rows, key=lambda r: abs(r[2]))
    names = {"mistral": "Mistral", "llama": "Llama", "qwen2": "Qwen2", "phi3": "Phi-3"}
    summary = re.search(r"All (\d+) peaks are within (\d+)% \(the largest: (\S+) with (\w+) at micro-batch 2, "
                        r"([+-][\d.]+)%; at 16 all are within ([\d.]+)%\), and the activations per sample within "
                        r"([\d.]+)%", text)
    assert summary, "the sentence under the zoo's table"
    count, bound, name, shown_kind, largest, at_16, slopes = summary.groups()
    assert int(count) == 2 * len(rows) and max(max(abs(r[2]), abs(r[3])) for r in rows) <= int(bound)
    assert (name, shown_kind, float(largest)) == (names.get(family, family), kind, small)
    assert max(abs(r[3]) for r in rows) <= float(at_16) < max(abs(r[3]) for r in rows) + 0.1
    worst = max(abs(estimated / measured - 1) for *_, estimated, measured in rows)
    assert worst * 100 <= float(slopes) < worst * 100 + 0.1


def test_the_trust_lines_are_what_the_estimate_prints():
    from gaplan.estimate.trust import trust_of

    text = (ROOT / "docs" / "estimate.md").read_text().split("**Trust.**", 1)[1]
    lines = [line.strip().removeprefix("trust: ") for line in text.splitlines() if line.startswith("    trust: ")]
    assert lines == [trust_of("llama", {"lora": True}, "cpu").describe(), trust_of("falcon", {}, "cpu").describe()]


def test_the_optimizers_bound_is_the_levers_table():
    """estimate.md's "within 1.8% for every optimizer and the chunked loss" is the largest error of levers.md's table
    of estimates against CPU trials (measured on 2026-12-05; tests/estimate/test_levers.py holds each to 3%, heavy)."""
    table = (ROOT / "docs" / "levers.md").read_text().split("| model | lever | micro-batch 2 |", 1)[1].split("\n\n")[0]
    errors = [abs(float(e)) for e in re.findall(r"\| ([+-][\d.]+)%", table)]
    assert len(errors) >= 12
    bound = float(re.search(r"the estimate was within ([\d.]+)% for every optimizer and the chunked loss",
                            flat("docs/estimate.md")).group(1))
    assert max(errors) <= bound < max(errors) + 0.1


# ---- levers.md: the cost model, the pick, the rows ------------------------------------------------------------------


def test_the_cost_models_rates_are_the_codes():
    from gaplan.plan.lever_cost import RATES

    text = flat("docs/levers.md")
    cuda, cpu = RATES["cuda"], RATES["cpu"]
    assert (f"on CUDA {cuda.flops_per_s / 1e12:g} TFLOP/s and {cuda.bytes_per_s / 1e12:g} TB/s (NVIDIA H100 SXM "
            f"datasheet" in text)
    assert f"On the CPU {cpu.flops_per_s / 1e12:g} TFLOP/s and {cpu.bytes_per_s / 1e9:g} GB/s (Intel Xeon" in text
    # The CPU's rates are the arithmetic the page gives for them.
    cores, ghz, per_cycle = re.search(r"(\d+) cores x ([\d.]+) GHz x (\d+) FP32 FLOP a cycle", text).groups()
    assert int(cores) * float(ghz) * int(per_cycle) / 1e3 == pytest.approx(cpu.flops_per_s / 1e12, abs=0.005)
    channels, mts = re.search(r"(\d+) channels of DDR4-(\d+)", text).groups()
    assert int(channels) * int(mts) * 8 / 1e3 == pytest.approx(cpu.bytes_per_s / 1e9)


def test_the_optimizer_passes_are_the_codes():
    from gaplan.plan.lever_cost import OPTIMIZER_PASSES as P

    text = flat("docs/levers.md")
    assert P["adamw-8bit"] == P["paged-adamw-8bit"] and P["adamw"][1] == P["lion"][1] == P["sgd"][1] == 0
    assert (f"AdamW is {P['adamw'][0]} (weight read and written, gradient read, two moments read and written), Lion "
            f"{P['lion'][0]}, SGD {P['sgd'][0]}, the 8-bit AdamWs {P['adamw-8bit'][0]} plus {P['adamw-8bit'][1]} bytes "
            f"(uint8 moments), and Adafactor {P['adafactor'][0]} plus {P['adafactor'][1]} bytes" in text)


def test_the_picks_tie_and_the_rows_counts_are_the_codes():
    from gaplan.plan.lever_pick import MODEL_TIE
    from gaplan.plan.levers import DEFAULT_LEVERS, OPTIMIZER_LEVERS, lever_rows, parse_levers

    text = flat("docs/levers.md")
    assert f"Times within {MODEL_TIE:.0%} of the least are a tie" in text
    words = ['', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine', 'ten']
    assert f"`optimizers` names all {words[len(OPTIMIZER_LEVERS)]}" in text
    default, everything = len(lever_rows(DEFAULT_LEVERS)), len(lever_rows(parse_levers("all")))
    assert f"So the default is {default} rows, and `--levers all` with `--optimizer adamw` is {everything}" in text
    assert "Lion's lighter optimizer step saves under 2% of this step, a tie" in text and MODEL_TIE == 0.02


def test_the_lever_tables_prose_is_its_table():
    """levers.md's example: the sentence under the table quotes its B*, steps and modelled time (the table itself is
    re-estimated by tests/test_docs_levers.py, heavy)."""
    text = (ROOT / "docs" / "levers.md").read_text()
    part = text.split("| levers | B\\* | split | steps | peak | time (model) |", 1)[1].split("\n\n", 1)
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                          for line in part[0].strip().splitlines()[1:])}
    base, both = rows["base"], rows["chunked+ckpt"]
    prose = " ".join(part[1].split())
    assert (f"take B\\* from {base[1]} to {both[1]} and the steps from {base[3]} to {both[3]}" in prose)
    assert f"The model still puts them {round(100 * (float(both[5].rstrip('x')) - 1))}% slower" in prose


def test_the_prose_under_the_levers_block_is_its_file():
    """levers.md's sentences under the table rendered from docs/data/levers.json quote that file's numbers."""
    import json

    rows = json.loads((ROOT / "docs" / "data" / "levers.json").read_text())["rows"]
    text = flat("docs/levers.md").split("<!-- end generated -->", 1)[1]
    off, every, on, compiled = (rows[name] for name in ("off", "every:2", "on", "compile"))

    def cpu(row: dict) -> float:
        return row["step_cpu_seconds"][-1] / off["step_cpu_seconds"][-1]

    assert f"`every:2` buys {every['edge'] - off['edge']} samples of B\\* ({off['edge']} to {every['edge']}) for about a " \
           f"fifth more CPU time a step" in text and round(cpu(every) - 1, 1) == 0.2
    assert f"`on` buys {on['edge'] - off['edge']} (to {on['edge']}) for about a third more" in text
    assert abs(cpu(on) - 4 / 3) < 0.05
    assert f"`--compile` ran the step in {cpu(compiled):.2f}x the CPU time of the eager step" in text
    assert f"Its peak at micro-batch 8 was {round((compiled['peak_bytes'] - off['peak_bytes']) / MiB)} MiB higher" in text


# ---- probe.md: the options' choices and defaults -------------------------------------------------------------------


def test_the_probe_pages_optimizers_and_learning_rates_are_the_codes():
    from gaplan.workload.spec import DEFAULT_LR, OPTIMIZERS

    text = flat("docs/probe.md")
    assert f"`--optimizer {'|'.join(OPTIMIZERS)}`" in text
    high = [name for name, lr in DEFAULT_LR.items() if lr == 1e-3]
    low = [name for name, lr in DEFAULT_LR.items() if lr == 1e-4]
    assert set(high) == {"adamw", "adamw-fused", "adamw-forloop", "adamw-8bit", "paged-adamw-8bit", "adafactor"}
    assert set(low) == {"lion", "sgd"}
    assert ("`--lr` (default 1e-3 for AdamW, its fused, for-loop and 8-bit forms and Adafactor, 1e-4 for Lion and SGD: "
            "`DEFAULT_LR` in "
            "`gaplan/workload/spec.py`" in text)


def test_the_train_pages_levers_and_cuda_budget_are_the_codes():
    from gaplan.core.constants import DEFAULT_CPU_BUDGET
    from gaplan.devices.reserve import CONTEXT_BYTES
    from gaplan.plan.split import MAX_ACCUM_STEPS
    from gaplan.workload.spec import OPTIMIZERS

    text = flat("docs/train.md")
    assert f"`--optimizer {'|'.join(OPTIMIZERS)}`" in text
    assert f"caps its trials' allocator at M less the {mib(CONTEXT_BYTES)} context allowance" in text
    assert f"`--memory-limit` (default {DEFAULT_CPU_BUDGET / 2**30:g} GiB)" in text
    assert f"more than {MAX_ACCUM_STEPS:,} accumulation steps" in text


def test_the_resume_pages_rate_line_is_the_one_the_cli_test_gets():
    """resume.md's "learning rate at step 5" line is what `gaplan train --resume --steps 8` prints in
    tests/cli/test_resume_anywhere.py, which runs it (4 SGD steps at lr 0.1, then 8)."""
    line = re.search(r"\n    (learning rate at step \d+: .+)\n", (ROOT / "docs" / "resume.md").read_text()).group(1)
    assert f'"{line}" in result.stderr' in (ROOT / "tests" / "cli" / "test_resume_anywhere.py").read_text()


def test_ddps_bucket_size_is_torchs_default():
    """gpu.md's 25 MiB gradient buckets are torch's default, read from its source (torch is not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        pytest.skip("torch is not installed")
    source = (pathlib.Path(spec.origin).parent / "nn" / "parallel" / "distributed.py").read_text()
    cap = int(re.search(r"^_DEFAULT_BUCKET_CAP_MB = (\d+)$", source, re.M).group(1))
    assert f"DDP's gradient buckets ({cap} MiB buckets, torch's `_DEFAULT_BUCKET_CAP_MB`" in flat("docs/gpu.md")


def test_the_gpu_checks_settings_are_the_checks():
    """gpu.md describes each check of tests/gpu by its settings; the checks' source holds the same ones."""
    gpu_test = (ROOT / "tests" / "gpu" / "test_gpu.py").read_text()
    nccl_test = (ROOT / "tests" / "gpu" / "test_gpu_nccl.py").read_text()
    text = flat("docs/gpu.md")
    assert "the exact edge (tiny-gpt2 and tiny-llama, seq 256, a 2 GiB budget)" in text
    assert '[("tiny-gpt2", 256), ("tiny-llama", 256)]' in gpu_test and "memory_limit=2 * GiB" in gpu_test
    bound = int(re.search(r"within ±(\d+)% of `max_memory_reserved` at three micro-batches \(tiny-llama, seq 512, bf16\)",
                          text).group(1))
    assert 'WorkloadSpec(model="tiny-llama", seq_len=512, dtype="bf16")' in gpu_test
    assert f"abs(e) <= {bound / 100:g} for e in errors" in gpu_test
    micro = int(re.search(r"a DDP step's reserved peak \(tiny-gpt2, seq 256, micro-batch (\d+)\)", text).group(1))
    assert f"MICRO_BATCH = {micro}\n" in nccl_test and 'WorkloadSpec(model="tiny-gpt2", seq_len=256)' in nccl_test


def test_the_estimate_pages_targets_are_the_codes():
    """estimate.md's list of `--list-targets` ("H100 94/80 GB", "RTX 4090/3090": one name a variant) is the code's."""
    from gaplan.estimate.targets import list_targets

    listed = re.search(r"\* targets \(`--list-targets`\): (.+?) with their driver-reported memory",
                       flat("docs/estimate.md")).group(1)
    names = []
    for item in listed.split(", "):
        words = item.split()
        family, variants = (words[0], words[1].split("/")) if len(words) > 1 else (item, [""])
        names += [f"{family}-{v}gb" if words[-1] == "GB" else f"{family}-{v}" if v else family for v in variants]
    assert sorted(n.lower() for n in names) == sorted(t.name for t in list_targets())


def test_the_8bit_optimizers_thresholds_are_the_codes_and_bitsandbytes():
    """levers.md's optimizer table: a float32 absmax per 256-element block, two 256-entry maps, float32 moments under
    4,096 elements (gaplan's counts), and paged states from 100,000 elements (bitsandbytes' own source, not imported)."""
    import importlib.util

    from gaplan.workload.optimizer_states import BNB_BLOCK, BNB_MIN_8BIT_SIZE, BNB_QMAP_ENTRIES

    text = flat("docs/levers.md")
    assert (f"a float32 absmax per {BNB_BLOCK}-element block of each; the two {BNB_QMAP_ENTRIES}-entry quantile maps "
            f"once; float32 moments under {BNB_MIN_8BIT_SIZE:,} elements" in text)
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or not spec.origin:
        pytest.skip("bitsandbytes is not installed")
    source = (pathlib.Path(spec.origin).parent / "optim" / "optimizer.py").read_text()
    paged = float(re.search(r"if not self\.is_paged or p\.numel\(\) < ([\d.e]+):", source).group(1))
    assert f"states of {int(paged):,} elements or more in CUDA unified memory" in text
