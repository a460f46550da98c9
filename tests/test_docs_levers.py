"""levers.md's figures that come from the estimate or from counting, re-made from the code: the optimizer states of
Llama-3-8B (a meta build) and the example lever table of `gaplan plan` (eight estimates of tiny-gpt2 on fake tensors:
the same on every machine). Heavy: about 25 s on 2 cores."""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest

from .test_docs_sources import flat

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.heavy


def test_llama_3_8bs_optimizer_states_are_the_counted_ones():
    from gaplan.workload.build import WorkloadSpec, build_workload
    from gaplan.workload.optimizers import optimizer_state_bytes

    text = flat("docs/levers.md")
    shown = re.search(r"Llama-3-8B with full fine-tuning keeps ([\d.]+) GiB of AdamW state, ([\d.]+) GiB for "
                      r"`adamw-8bit`, ([\d.]+) GiB for `lion` and ([\d.]+) GiB for `adafactor`", text).groups()
    model = build_workload(WorkloadSpec(model="llama-3-8b"), "meta").model
    counted = [f"{optimizer_state_bytes(model, name) / 2**30:.2f}" for name in ("adamw", "adamw-8bit", "lion", "adafactor")]
    assert list(shown) == counted


def test_the_example_lever_table_is_todays_estimate():
    """Every cell of the page's table (B*, split, steps, peak, modelled time) is `gaplan plan`'s row for the page's
    command, and the prose's 22 MB of weights is the model's."""
    from gaplan.core.units import parse_bytes
    from gaplan.report.lever_report import lever_records
    from gaplan.workflows.plan_levers import compare_levers, cost_inputs
    from gaplan.workload.spec import WorkloadSpec

    text = (ROOT / "docs" / "levers.md").read_text()
    part = text.split("**An example**", 1)[1]
    command = shlex.split(part.split("```\n", 1)[1].split("```", 1)[0].replace("\\\n", " "))
    options = {word: command[i + 1] for i, word in enumerate(command[:-1]) if word.startswith("--")}
    assert options["--layouts"] == "ddp" and options["--device"] == "cpu"
    spec = WorkloadSpec(model="tiny-gpt2", dtype=options["--dtype"])
    table = compare_levers(spec, effective_batch=int(options["--effective-batch"]), levers=options["--levers"],
                           memory_limit=parse_bytes(options["--memory-limit"]), device_kind="cpu",
                           threads=int(options["--threads"]))
    shown = [[cell.strip() for cell in line.strip("|").split("|")]
             for line in part.split("| levers | B\\* |", 1)[1].split("\n\n", 1)[0].strip().splitlines()[2:]]
    today = [[str(r[c]) for c in ("levers", "B*", "split", "steps", "peak", "time (model)")]
             for r in lever_records(table)]
    assert shown == today
    weights = cost_inputs(spec, "cpu").param_count * 4 / 1e6
    assert f"(reading {round(weights)} MB of weights)" in flat("docs/levers.md")


def test_the_default_chunk_is_the_codes():
    """"the power of two whose fp32 logits fit in 16 MiB: 512 positions at V = 8,192, 128 at 32,000 and 32 at
    128,256" (gaplan/workload/chunked_loss.py imports torch: here with the heavy tests)."""
    from gaplan.workload.chunked_loss import DEFAULT_CHUNK_LOGITS_BYTES, default_chunk_tokens

    text = flat("docs/levers.md")
    m = re.search(r"the power of two whose fp32 logits fit in (\d+) MiB: (\d+) positions at V = ([\d,]+), (\d+) at "
                  r"([\d,]+) and (\d+) at ([\d,]+)", text)
    assert int(m.group(1)) * 2**20 == DEFAULT_CHUNK_LOGITS_BYTES
    for tokens, vocab in ((m.group(2), m.group(3)), (m.group(4), m.group(5)), (m.group(6), m.group(7))):
        assert default_chunk_tokens(int(vocab.replace(",", ""))) == int(tokens), vocab
