"""The docs' small deterministic claims, run or read from the code: a plan a page prints, a token budget, the noise
scale's line, a default. Each test reads the claim out of the page, so editing either the page or the code alone
fails here. No torch: every check is the library's pure arithmetic or an option's declared default (a few ms)."""

from __future__ import annotations

import json
import math
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def page(name: str) -> str:
    return (ROOT / name).read_text()


def probes() -> dict:
    return json.loads((ROOT / "docs" / "data" / "probes.json").read_text())["probes"]


# ---- plans the pages print --------------------------------------------------------------------------------------------


def test_the_readme_sample_plan_is_todays_split_of_the_recorded_edge():
    """README's sample run ends in the plan for the recorded default edge (docs/data/probes.json)."""
    from gaplan import make_plan

    edge = probes()["default-seeded"]["edge"]
    sample = page("README.md").split("probing tiny-gpt2 (each trial", 1)[1].split("```", 1)[0]
    line = next(line for line in sample.splitlines() if line.startswith("plan: "))
    assert line == f"plan: {make_plan(256, edge).describe()}"


def test_the_readme_prose_gives_the_recorded_default_probes():
    """The paragraph under the sample: the seed, the trial beside it, and the plain search's trial count."""
    runs = probes()
    seeded, plain = runs["default-seeded"], runs["default-plain"]
    text = " ".join(page("README.md").split("GPT-2 is in the estimate's zoo", 1)[1].split("\n\n", 1)[0].split())
    edge = seeded["edge"]
    assert f"predicts, {seeded['trials'][0]['micro_batch']}; it then checks {edge + 1}" in text
    assert f"trains {edge} for two steps and runs out of memory at {edge + 1}" in text
    assert f"{len(plain['trials'])} trials here" in text


def test_the_readme_api_example_prints_todays_plan():
    from gaplan import make_plan

    total, cap, printed = re.search(r"print\(make_plan\((\d+), (\d+)\)\.describe\(\)\)\n# (.+)\n", page("README.md")).groups()
    assert printed == make_plan(int(total), int(cap)).describe()


def test_the_trainer_pages_uneven_plan_and_its_even_split():
    """hf-trainer.md: 256 at B*=48 is 43,43,43,43,42,42 and the Trainer runs the largest even split, 32 x 8."""
    from gaplan import make_plan
    from gaplan.plan.split import split_evenly

    text = " ".join(page("docs/hf-trainer.md").split())
    total, cap, sizes, micro, steps = re.search(r"(\d+) at B\\\*=(\d+) is ([\d,]+)\) becomes the largest even split "
                                                r"that fits \((\d+) × (\d+)\)", text).groups()
    plan = make_plan(int(total), int(cap))
    assert ",".join(map(str, plan.micro_batch_sizes)) == sizes
    # The Trainer's even plan (gaplan.integrations.transformers.even_plan, which imports transformers): the largest
    # micro-batch within the cap that divides the share.
    even = max(d for d in range(1, int(cap) + 1) if int(total) % d == 0)
    assert (even, int(total) // even) == (int(micro), int(steps))
    assert split_evenly(int(total), plan.grad_accum_steps) == plan.micro_batch_sizes


def test_the_sharded_pages_splits_are_todays():
    """sharded.md: the probe's plan at its B*, and the layout table's per-rank splits."""
    from gaplan import make_plan
    from gaplan.plan.layouts import format_split, split_sizes

    text = page("docs/sharded.md")
    edge = int(re.search(r"largest micro-batch that fits: (\d+) +\[12 trials", text).group(1))
    plan_line = re.search(r"\nplan: (effective batch 256 = .+ world size 2 .+)\n", text).group(1)
    assert plan_line == make_plan(256, edge, 2).describe()
    # 512 over 8 ranks: 3 accumulation steps at B* 25 and 22 at B* 3 (the offload rows), as the table prints them.
    assert format_split(split_sizes(512, 8, 3), 8) == "22,21,21 x 8"
    assert format_split(split_sizes(512, 8, 22), 8) == "(3 x 20 + 2 x 2) x 8"
    assert "22,21,21 x 8" in text and "(3 x 20 + 2 x 2) x 8" in text


# ---- token budgets ------------------------------------------------------------------------------------------------------

TSTAR = re.compile(r"T\* = (\d+) tokens per micro-batch \(granule (\d+)\): (\d+) x (\d+) tokens \(B\* (\d+) at the "
                   r"longest\) and (\d+) x (\d+) \(B\* (\d+) at the shortest\) fit; (\d+) overflows the (\w+)")


def test_every_token_budget_line_is_what_the_edges_give():
    from gaplan.plan.tokens import budget_from_edges

    lines = [m for m in TSTAR.finditer(page("docs/token-budgets.md"))]
    assert len(lines) >= 4
    for m in lines:
        _, granule, _, longest, long_edge, _, shortest, short_edge, _, _ = m.groups()
        budget = budget_from_edges(int(shortest), int(short_edge), int(longest), int(long_edge), int(granule))
        assert m.group(0) == budget.describe()


def test_the_token_budget_example_in_prose():
    """"B* = 7 at 256 tokens and 654 at 3 tokens give T* = 1920 (7 × 256 and 640 × 3 fit; 1984 would need 661 × 3)"."""
    from gaplan.plan.tokens import DEFAULT_GRANULE, budget_from_edges

    text = " ".join(page("docs/token-budgets.md").split())
    m = re.search(r"B\\\* = (\d+) at (\d+) tokens and (\d+) at (\d+) tokens give T\\\* = (\d+) \((\d+) × (\d+) and "
                  r"(\d+) × (\d+) fit; (\d+) would need (\d+) × (\d+)\)", text)
    long_edge, longest, short_edge, shortest, t_star, n_long, _, n_short, _, over, need, _ = map(int, m.groups())
    budget = budget_from_edges(shortest, short_edge, longest, long_edge, DEFAULT_GRANULE)
    assert budget.token_budget == t_star
    assert (n_long, n_short) == (t_star // longest, t_star // shortest)
    assert over == t_star + DEFAULT_GRANULE and need == over // shortest > short_edge


# ---- the noise scale ---------------------------------------------------------------------------------------------------


def test_the_noise_scale_line_is_what_the_code_says_for_its_ratio():
    from gaplan.plan.goodput import noise_scale_summary

    text = page("docs/noise-scale.md")
    shown = " ".join(text.split("\n    noise scale: ", 1)[1].split("\n\n", 1)[0].split())
    batch, ratio = re.match(r"effective batch (\d+) is ([\d.]+)x", shown).groups()
    assert shown == noise_scale_summary(int(batch), int(batch) / float(ratio))


def _unbiased_statements() -> list[str]:
    """noise-scale.md's statements of when the reading is unbiased, one a bullet, unwrapped."""
    block = page("docs/noise-scale.md").split("<!-- unbiased: statements and the tests that hold them -->", 1)[1]
    block = block.split("<!-- end unbiased -->", 1)[0]
    return [" ".join(("- **" + item).split()) for item in block.split("\n- **")[1:]]


def test_each_statement_of_when_the_noise_scale_is_unbiased_names_a_test_that_exists():
    """Every condition noise-scale.md states (with replacement, without replacement with the correction, across an
    epoch boundary, the ranks, declared per-call draws, unknown drawings) names the test holding it, and that test is
    there. The statements the issue asked for are all present."""
    import ast

    statements = _unbiased_statements()
    heads = [re.match(r"- \*\*([^*]+)\*\*", s).group(1) for s in statements]
    for words in ("With replacement", "Without replacement, with the finite-population correction",
                  "A step across an epoch boundary", "Ranks (DDP)", "draws without replacement", "Unknown drawing"):
        assert any(words in head for head in heads), (words, heads)
    for statement in statements:
        names = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", statement)
        names = names or [(path, None) for path in re.findall(r"(tests/[\w/]+\.py)", statement)]
        assert names, statement
        for path, name in names:
            tree = ast.parse((ROOT / path).read_text())
            defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert name is None or name in defined, (path, name)


def test_the_finite_population_correction_the_page_states_is_the_codes():
    """``v = (N − n) / (n (N − 1))`` for a mean of n samples of one permutation, and the bias of counting 1/n, as
    gaplan.plan.draws computes them and as the unknown drawing's line says it."""
    from gaplan.plan.draws import Drawing, inverse_sizes, unknown_drawing

    text = " ".join(_unbiased_statements())
    assert "`v = (N − n) / (n (N − 1))`" in text and "`1/(1 − B_noise/N)`" in text
    for population, n in ((240, 24), (64, 8), (1000, 999)):
        v_small, v_big = inverse_sizes(Drawing("epochs", population), 2, 2 * n, 2 * n, 2 * n, 2.0, 2 / n, 4.0)
        assert v_small == pytest.approx((population - n) / (n * (population - 1)), rel=1e-12)
        assert v_big == pytest.approx((population - 2 * n) / (2 * n * (population - 1)), rel=1e-12)
    assert "1/(1 - B_noise/N)" in unknown_drawing("the Trainer")
    assert "1/(1 - B_noise/1000)" in unknown_drawing("the Trainer", 1000)


def test_the_adaptive_pages_rule_level_is_where_the_rule_stops():
    """adaptive.md: the rule's level is the first E of the doublings with 2E ≥ B_noise. The schedule itself
    (BatchSchedule.after_step, fed noise-free step estimates at each known noise scale of the page's table, plus the
    boundary 16 = 2 x 8) stops there, and the table's "the rule stops at" column is that level."""
    from gaplan.plan.growth_test import StepNoise
    from gaplan.plan.schedule import BatchSchedule

    text = " ".join(page("docs/adaptive.md").split())
    assert "The rule's level is the first `E` of the doublings with `2E ≥ B_noise`" in text
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \| \d+ of 20 \|", page("docs/adaptive.md"), re.MULTILINE)
    assert len(rows) == 6
    schedule = BatchSchedule("adaptive", minimum=2, maximum=64)

    def stops_at(noise_scale: float) -> int:
        state = schedule.start()
        for step in range(400):
            state, _ = schedule.after_step(state, step, StepNoise(grad_var=noise_scale, grad_sq=1.0))
        return state.effective_batch

    def page_level(noise_scale: float) -> int:
        return next((e for e in schedule.levels if 2 * e >= noise_scale), schedule.maximum)

    for _, scale, level in rows:
        assert stops_at(float(scale)) == page_level(float(scale)) == int(level), (scale, level)
    assert stops_at(16.0) == page_level(16.0) == 8  # at B_noise = 2E exactly the rule does not double


def test_the_learning_rate_note_is_the_tuners():
    from gaplan.plan.goodput import scaled_learning_rate

    text = " ".join(page("docs/noise-scale.md").split())
    rate, ref, batch, linear, root = re.search(r'"the learning rate ([\d.]+) was set for (\d+); for (\d+), linear '
                                               r'scaling gives ([\d.]+) and square-root ([\d.]+)"', text).groups()
    args = float(rate), int(batch), int(ref)
    assert f"{scaled_learning_rate(*args, 'linear'):.3g}" == linear
    assert f"{scaled_learning_rate(*args, 'sqrt'):.3g}" == root


def test_the_goodput_runs_table_and_its_sums():
    """noise-scale.md's one measured run: goodput = samples/s x efficiency, efficiency is Pollux's at one noise scale,
    the chosen row has the best goodput, and the bullets' shares are the runs' own."""
    from gaplan.plan.goodput import samples_factor, statistical_efficiency

    text = page("docs/noise-scale.md")
    part = text.split("## One run where it mattered", 1)[1]
    noise = float(re.search(r"a\s+noise scale of ~(\d+) samples", part).group(1))
    rows = [re.match(r"\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| *(\w*) *\|", line).groups()
            for line in part.splitlines() if re.match(r"\| \d+ \|", line)]
    asked = next(int(r[0]) for r in rows if r[4] == "asked")
    for batch, rate, efficiency, goodput, _ in rows:
        # Each column is rounded for print: the product carries efficiency's 0.005 and samples/s's 0.05.
        slack = 0.005 * float(rate) + 0.05 * float(efficiency) + 0.05
        assert float(goodput) == pytest.approx(float(rate) * float(efficiency), abs=slack)
        assert float(efficiency) == pytest.approx(statistical_efficiency(int(batch), noise, asked), rel=0.02)
    assert max(rows, key=lambda r: float(r[3]))[4] == "chosen"
    flat = " ".join(part.split())
    secs, samples = map(float, re.search(r"for \d+ steps, ([\d.]+) s, (\d+) samples", flat).groups())
    chosen_s, chosen_samples, time_share, sample_share = re.search(
        r"in ([\d.]+) s and (\d+) samples: \*\*(\d+)% of the time\*\* and (\d+)% of the samples", flat).groups()
    assert round(100 * float(chosen_s) / secs) == int(time_share)
    assert round(100 * int(chosen_samples) / samples) == int(sample_share)
    assert f"the {math.floor(secs - float(chosen_s))} s saved" in flat
    chosen = next(int(r[0]) for r in rows if r[4] == "chosen")
    said = re.search(r"The model had said (\d+)% of the samples: `\(1 \+ (\d+)/(\d+)\) / \(1 \+ (\d+)/(\d+)\)`", flat)
    assert (int(said.group(2)), int(said.group(4))) == (chosen, asked) and int(said.group(3)) == noise
    assert round(100 * samples_factor(chosen, noise) / samples_factor(asked, noise)) == int(said.group(1))


# ---- defaults the pages state ------------------------------------------------------------------------------------------


def _defaults(command: str) -> dict:
    from gaplan.cli.main import main

    return {param.name: param.default for param in main.get_command(None, command).params}


def test_the_bench_pages_defaults_are_the_commands():
    from gaplan.benchmark.stats import CONTENDED_CPU_PER_WALL, CONTENDED_SPREAD

    text = " ".join(page("docs/bench-and-reports.md").split())
    bench = _defaults("bench")
    assert f"`--rounds` ({bench['rounds']})" in text
    assert f"`--ci-target` (±{bench['ci_target']:.0%})" in text
    assert f"`--time-budget` ({bench['time_budget']:g} s)" in text
    assert f"`--max-rounds` ({bench['max_rounds']})" in text
    assert f"less than {CONTENDED_CPU_PER_WALL:g} CPU seconds per wall second" in text
    assert f"differ by more than {CONTENDED_SPREAD:.0%}" in text


def test_the_token_pages_defaults_are_the_codes():
    from gaplan.plan.tokens import DEFAULT_GRANULE

    text = " ".join(page("docs/token-budgets.md").split())
    bench = _defaults("bench")
    assert f"(`--granule`, default {DEFAULT_GRANULE} tokens)" in text
    assert f"`--warmup` (default {bench['warmup']})" in text and f"`--rounds` (default {bench['rounds']})" in text


def test_the_goodput_measuring_runs_default_steps():
    text = " ".join(page("docs/noise-scale.md").split())
    assert f"(`--measure-steps`, {_defaults('probe')['measure_steps']} by default)" in text


def test_the_cpu_pages_constants_are_the_codes():
    from gaplan.core.constants import DEFAULT_CPU_BUDGET
    from gaplan.devices.cpu import MMAP_THRESHOLD

    text = " ".join(page("docs/cpu-budget.md").split())
    assert f"`MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}`" in text
    assert f"every allocation over {MMAP_THRESHOLD // 1024} KiB" in text
    assert f"the CPU budget is **{DEFAULT_CPU_BUDGET / 2**30:g} GiB**" in text


def test_the_sharded_pages_hang_timeout_and_caveat_are_the_codes():
    from gaplan.plan.layouts import NEAR_LIMIT
    from gaplan.worker.serve import DEFAULT_RANK_TIMEOUT_S

    text = " ".join(page("docs/sharded.md").split())
    assert f"A trial that hangs is killed after {DEFAULT_RANK_TIMEOUT_S / 60:g} minutes" in text
    assert f"within {NEAR_LIMIT:.0%} of the usable memory gets a `caveat:` line" in text


# ---- comparison.md's prose, against reports/peers/peers.json ----------------------------------------------------------


def test_the_comparison_prose_is_the_peer_runs():
    data = json.loads((ROOT / "reports" / "peers" / "peers.json").read_text())
    settings, rows = data["settings"], {row["tool"]: row for row in data["batch_size"]}
    text = " ".join(page("docs/comparison.md").split())
    # The loop's setup.
    micro, steps = settings["loop_micro_batch"], settings["loop_accumulation"]
    assert f"Micro-batch {micro} × {steps} accumulation steps ({micro * steps} samples a step)" in text
    assert (f"{settings['loop_warmup']} warm-up step and {settings['loop_steps']} timed steps, "
            f"{settings['repeats']} runs each") in text
    assert f"({settings['model']}, seq {settings['seq_len']}, AdamW, fp32) under the same " \
           f"{settings['memory_limit'].removesuffix('GiB')} GiB CPU budget" in text
    # accelerate's ladder: from 128, times 0.9 after each OOM, stepping over the edge.
    ladder = [int(b.rstrip("x")) for b in rows["accelerate find_executable_batch_size"]["tried"].split()]
    assert ladder[0] == 128 and all(after == int(before * 0.9) for before, after in zip(ladder, ladder[1:], strict=False))
    edge = data["true_edge"]
    assert f"its ladder (…, {ladder[-2]}, {ladder[-1]}) steps over {ladder[-1] + 1}–{edge}" in text
    # Lightning's binsearch ran out of memory at the true edge in its own process.
    binsearch = rows["Lightning scale_batch_size (binsearch)"]["tried"].split()
    assert f"{edge}x" in binsearch
    assert f"Lightning's binsearch ran out of memory at {edge} *in its own process*, though {edge} fits a fresh one" \
        in text


def test_the_probe_cost_tables_ratios_and_trials():
    """estimate.md's probe_cost table (a dated measurement): each ratio is its seconds over binsearch's, and a
    finder's listed trials are as many as its trials column."""
    part = page("docs/estimate.md").split("| finder | trials | found | seconds | vs binsearch |", 1)[1].split("\n\n")[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in part.strip().splitlines()[1:]]
    reference = float(rows[-1][3])
    for finder, trials, found, seconds, ratio in rows[:-1]:
        assert float(ratio.rstrip("x")) == pytest.approx(float(seconds) / reference, abs=0.005)
        listed = re.search(r"\((?:seeded: )?(.+)\)", finder).group(1)
        sizes = re.findall(r"(\d+)(x| OOM|)", listed.replace(" fits", ""))
        assert len(sizes) == int(trials)
        assert max(int(b) for b, oom in sizes if not oom) == int(found)


def test_the_long_tailed_corpus_profile_is_what_its_script_writes(tmp_path):
    """token-budgets.md: the corpus script on the page, run, gives the length profile the sample output shows (byte
    tokens: one a byte)."""
    import contextlib
    import io

    from gaplan.plan.tokens import LengthProfile

    text = page("docs/token-budgets.md")
    script = text.split("python - > corpus.txt <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(script, "token-budgets.md", "exec"), {})  # noqa: S102 - the page's own script
    profile = LengthProfile.of([len(line.encode()) for line in out.getvalue().splitlines()])
    shown = text.split("```\nlengths    ", 1)[1].split("\n\n", 1)[0].splitlines()
    assert shown[0] == profile.describe()
    assert [tuple(map(int, re.match(r"\s*(\d+)-(\d+) .* (\d+)$", row).groups())) for row in shown[1:]] == \
        list(profile.histogram)
    assert f"data: {profile.count} samples from {profile.count} records in corpus.txt" in text


def test_the_token_probes_sample_output_is_its_recorded_run():
    """token-budgets.md's `gaplan probe --batch-by tokens` output is docs/data/token_probe.json's: the profile, each
    probe's trials (size, fits, peak) and B*, T*'s line and the samples plan. Re-measure it and this fails until the
    page shows the new run."""
    from gaplan import make_plan
    from gaplan.plan.tokens import TokenBudget

    data = json.loads((ROOT / "docs" / "data" / "token_probe.json").read_text())
    text = page("docs/token-budgets.md")
    sample = text.split("```\nlengths    ", 1)[1].split("```", 1)[0]
    assert f"On {data['measured']['date']} ({data['measured']['cores']} cores" in text
    budget = TokenBudget(**data["token_budget"])
    for end in ("longest", "shortest"):
        probe = data["probes"][end]
        part = sample.split(f"B* at the {end} length, {probe['seq_len']} tokens: {probe['max_micro_batch']}   "
                            f"[{len(probe['trials'])} trials]\n", 1)[1].split("\n\n", 1)[0]
        shown = [re.match(r"\s+micro-batch\s+(\d+)\s+(fits|OOM)\s+peak\s+([\d.]+ MiB|-)", line).groups()
                 for line in part.splitlines()]
        assert shown == [(str(t["micro_batch"]), "fits" if t["fits"] else "OOM",
                          f"{t['peak_bytes'] / 2**20:.2f} MiB" if t["fits"] else "-") for t in probe["trials"]]
    assert f"\n{budget.describe()}\n" in sample
    plan = make_plan(data["effective_batch"], budget.long_edge)
    assert f"samples plan at the longest length: {plan.describe()}\n" in sample
    assert (f"{data['profile']['count']} samples of {data['profile']['shortest']} to {data['profile']['longest']} "
            f"tokens: median {data['profile']['median']:g}") in sample


def test_the_bench_pages_verdict_is_the_codes_sentence():
    """bench-and-reports.md quotes a verdict: the code says exactly that for its ratio and interval."""
    from gaplan.benchmark.stats import Estimate, verdict

    text = " ".join(page("docs/bench-and-reports.md").split())
    quoted = re.search(r'\*\*A verdict that names its noise\*\*: "([^"]+)"', text).group(1)
    value, low, high = map(float, re.search(r"at ([\d.]+)x .*CI ([\d.]+)-([\d.]+)", quoted).groups())
    assert verdict(Estimate(value, low, high, 3)) == quoted


def test_the_readmes_other_machine_edge_is_the_peer_runs():
    data = json.loads((ROOT / "reports" / "peers" / "peers.json").read_text())
    text = " ".join(page("README.md").split())
    assert f"the same default gave {data['true_edge']} in the peer comparison's run" in text
    assert data["settings"]["model"] == "tiny-gpt2" and data["settings"]["seq_len"] == 128
    assert f"transformers {data['versions']['transformers'].rsplit('.', 1)[0]}" in text


def _options(command: str) -> dict[str, str]:
    words = command.split()
    return {word: words[i + 1] for i, word in enumerate(words[:-1]) if word.startswith("--")
            and not words[i + 1].startswith("--")}


def test_the_token_probe_is_the_pages_command_and_replays_to_its_edges():
    """The page's `gaplan probe --batch-by tokens` asks for what the recorded run ran (a changed budget or length on
    the page fails), and today's search, fed the recorded peaks, asks for the recorded trials at both lengths."""
    from gaplan.core.units import parse_bytes
    from gaplan.plan.tokens import LONG_SEARCH_CAP, short_search_cap

    from .test_docs_numbers import replay

    data = json.loads((ROOT / "docs" / "data" / "token_probe.json").read_text())
    shown = next(line for line in page("docs/token-budgets.md").splitlines()
                 if line.startswith("gaplan probe --data corpus.txt") and "--batch-by tokens" in line)
    assert _options(shown) == _options(data["command"]) and "--batch-by tokens" in data["command"]
    assert parse_bytes(_options(shown)["--memory-limit"]) == data["memory_limit_bytes"]
    longest, shortest = data["probes"]["longest"], data["probes"]["shortest"]
    caps = {"longest": LONG_SEARCH_CAP,
            "shortest": short_search_cap(longest["seq_len"], longest["max_micro_batch"], shortest["seq_len"])}
    for end, probe in data["probes"].items():
        run = {"trials": probe["trials"], "limit_bytes": data["memory_limit_bytes"], "search_cap": caps[end],
               "command": data["command"]}
        asked, edge = replay(run)
        assert [b for b, _ in asked] == [t["micro_batch"] for t in probe["trials"]]
        assert edge == probe["max_micro_batch"]


def test_the_lora_pages_defaults_are_the_specs():
    from gaplan import WorkloadSpec

    spec = WorkloadSpec()
    text = " ".join(page("docs/lora.md").split())
    assert f"LoRA r={spec.lora_r} (alpha {spec.lora_alpha:g}, dropout {spec.lora_dropout:g})" in text


def _source(package: str, relative: str) -> str:
    """A peer's source file, read without importing it (importing imports torch)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        pytest.skip(f"{package} is not installed")
    return (pathlib.Path(spec.origin).parent / relative).read_text()


def test_the_peers_defaults_the_comparison_names_are_their_own():
    """comparison.md: accelerate starts at 128 and multiplies by 0.9; Lightning's binsearch keeps a 5% margin and
    runs three steps a trial by default."""
    text = " ".join(page("docs/comparison.md").split())
    accelerate = _source("accelerate", "utils/memory.py")
    assert re.search(r"starting_batch_size: int = 128\b", accelerate) and "int(batch_size * 0.9)" in accelerate
    assert "accelerate starts at 128 and multiplies by 0.9 after each OOM" in text
    scaling = _source("pytorch_lightning", "tuner/batch_size_scaling.py")
    tuning = _source("pytorch_lightning", "tuner/tuning.py")
    assert re.search(r"margin: float = 0\.05\b", scaling) and "It then keeps its default 5% margin" in text
    assert re.search(r"steps_per_trial: int = 3\b", tuning) and "Lightning its default three" in text


def test_the_sharded_pages_plan_prose_is_its_plan_output():
    """sharded.md's prose under `gaplan plan`'s 7B output quotes the pick's peak, its share of the card and B*'s peak
    from that output; the caveat's share is the peak over the usable memory."""
    from gaplan.plan.layouts import NEAR_LIMIT

    text = page("docs/sharded.md")
    pick = re.search(r"\npick: .*split 22,21,21 x 8 .*; peak ([\d.]+) GiB per rank at micro-batch 22 \(B\* (\d+) peaks "
                     r"at ([\d.]+) GiB\)", text)
    usable = float(re.search(r"on 8 x h100-80gb: ([\d.]+) GiB usable per rank", text).group(1))
    peak, edge, edge_peak = float(pick.group(1)), pick.group(2), pick.group(3)
    flat = " ".join(text.split())
    assert (f"peaks at {peak:.2f} GiB, {peak / usable:.0%} of the usable memory; B* {edge} would peak at {edge_peak} GiB"
            in flat)
    caveat = re.search(r"\ncaveat: the pick's peak, ([\d.]+) GiB per rank, is ([\d.]+)% of the ([\d.]+) GiB usable: "
                       r"within (\d+)% of the limit", text)
    assert caveat.group(1) == edge_peak and float(caveat.group(3)) == usable
    assert f"{100 * float(edge_peak) / usable:.1f}" == caveat.group(2) and int(caveat.group(4)) == NEAR_LIMIT * 100
    assert f"at {float(edge_peak) / usable:.1%} of the usable memory, and says so" in flat


def test_the_design_pages_module_length_is_the_layering_tests():
    from .test_layering import MAX_LINES

    assert f"no module is longer than {MAX_LINES} lines (checked by the same test)" in " ".join(
        page("docs/design.md").split())


def test_the_option_moving_lines_are_the_design_pages():
    """docs/design.md's count of the lines that move options (issue 56's measure): gaplan/cli/, the commands'
    options objects, parse_options.py and core/options.py."""
    files = {*ROOT.joinpath("gaplan/cli").glob("*.py"), *ROOT.joinpath("gaplan/workflows").glob("*_options.py"),
             ROOT / "gaplan/core/options.py"}
    count = sum(len(path.read_text().splitlines()) for path in files)
    assert f"{count:,} now" in " ".join(page("docs/design.md").split())
