"""The docs' numbers come from measurement files the repo re-makes, and a test catches drift.

* A block between ``<!-- generated: FILE [KEY] -->`` and ``<!-- end generated -->`` in a docs page is rendered from
  the committed measurement FILE by a renderer here: the page must hold exactly what the file renders to. Change a
  file without re-rendering (``python tests/test_docs_numbers.py --write``) and this fails.
* The probes the docs quote (``docs/data/probes.json``, from ``examples/documented_probes.py``) are replayed:
  today's search (``gaplan.plan.search.find_edge``) fed the recorded peaks must ask for the recorded trials, in
  order, and reach the recorded B*; a seeded probe's first trial is today's estimate. A change to the search, to
  the estimate, or to a recorded budget fails here.
"""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
# A measurement file's block (other blocks, e.g. a table rendered from the code, have their own tests).
BLOCK = re.compile(r"<!-- generated: ((?:docs/data|reports)/\S+)(?: (\S+))? -->\n(.*?)<!-- end generated -->", re.S)
PROBES = ROOT / "docs" / "data" / "probes.json"


def load(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def table(header: list[str], align: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def tried(trials: list[dict]) -> str:
    return " ".join(f"{t['micro_batch']}{'' if t['fits'] else 'x'}" for t in trials)


def mib(value: int) -> str:
    return f"{value / 2**20:.2f}"


# ---- docs/data/probes.json ------------------------------------------------------------------------------------------


def probe_runs(data: dict, key: str | None) -> str:
    """probe.md: every documented probe, its trials and B*, and when and where it ran."""
    rows = [[f"`{run['command']}`", f"`{tried(run['trials'])}`", str(len(run["trials"])), str(run["edge"]),
             f"{run['wall_seconds']:.1f}", run["date"]] for run in data["probes"].values()]
    machine = data["machine"]
    return (table(["probe", "tried (x: out of memory)", "trials", "B\\*", "wall s", "measured"],
                  ["---", "---", "--:", "--:", "--:", "---"], rows)
            + f"\n{machine['cpu']}, {machine['cores']} cores, python {machine['python']}, torch {machine['torch']}, "
              f"transformers {machine['transformers']}; re-measured by `{data['made_by']}`.\n")


def probe_sentence(data: dict, key: str) -> str:
    """One probe as a dated sentence: ``NAME``, or ``NAME+peaks`` to add the sketches' peaks."""
    name, _, extra = key.partition("+")
    run, machine = data["probes"][name], data["machine"]
    text = f"On {run['date']} ({machine['cores']} cores, torch {machine['torch']}), `{run['command']}` "
    if "--no-seed-from-estimate" not in run["command"] and not run["command"].startswith("python"):
        text += f"started at the estimate's {run['trials'][0]['micro_batch']}, "
    text += f"tried `{tried(run['trials'])}` ({len(run['trials'])} trials): B\\* = {run['edge']}"
    if extra == "peaks":
        sketches = [t for t in run["trials"] if t["fits"] and t["completed_steps"] == 1]
        text += " (peaks " + ", ".join(f"{t['micro_batch']}: {mib(t['peak_bytes'])}" for t in sketches) + " MiB)"
    fresh = [f"{'trains' if outcome == 'trains' else 'runs out of memory at' if outcome == 'OOM' else outcome + ' at'} "
             f"{micro_batch}" for micro_batch, outcome in run.get("fresh_process", {}).items()]
    if fresh:
        text += "; a new process " + " and ".join(fresh)
    return text + ".\n"


# ---- reports/peers/peers.json (examples/compare_with_peers.py) -----------------------------------------------------

FINDERS = {"gaplan": "**gaplan**", "accelerate find_executable_batch_size": "accelerate `find_executable_batch_size`",
           "Lightning scale_batch_size (power)": "Lightning `scale_batch_size` (power)",
           "Lightning scale_batch_size (binsearch)": "Lightning `scale_batch_size` (binsearch)"}
LOOPS = {"gaplan": "**gaplan** (`gaplan.train`, what `gaplan train` runs)",
         "HF Trainer": "HF `Trainer` (stock, sequential sampling)",
         "hand-written loop": "hand-written loop (`loss / accumulation_steps`)"}
LOSSES = {"gaplan": "**gaplan** (`accumulate_gradients`, `gaplan train`)",
          "HF Trainer + gaplan (GaplanTrainer)": "**HF Trainer + gaplan** (`GaplanTrainer`)",
          "HF Trainer": "HF `Trainer` (stock)", "accelerate Accelerator.accumulate": "accelerate `Accelerator.accumulate`",
          "Lightning accumulate_grad_batches": "Lightning `accumulate_grad_batches`"}


def peers(data: dict, key: str) -> str:
    if key == "machine":
        v = data["versions"]
        return (f"These numbers are from that run (`{data['command']}`: python {v['python']}, torch {v['torch']}, "
                f"transformers {v['transformers']}, accelerate {v['accelerate']}, pytorch-lightning "
                f"{v['pytorch-lightning']}, {data['cpu']}, {data['threads']} torch threads).\n")
    if key == "batch_size":
        rows = [[FINDERS.get(r["tool"], r["tool"]), str(r["found"]), str(r["true_edge"]),
                 "yes" if r["survives_step_2"] else "no", str(r["trials"]), f"{r['wall_s']:.1f}", r["tried"]]
                for r in data["batch_size"]]
        walls = {r["tool"]: r["wall_s"] for r in data["batch_size"]}
        ratio = walls["gaplan"] / walls["Lightning scale_batch_size (binsearch)"]
        return (table(["tool", "found", "true edge", "trains 2 steps", "trials", "wall s", "tried"],
                      ["---", "--:", "--:", "---", "--:", "--:", "---"], rows)
                + f"\ngaplan took **{ratio:.2f}×** binsearch's wall time in this run.\n")
    if key == "loop":
        rows = [[LOOPS.get(r["loop"], r["loop"]), f"{r['median_samples_per_s']:.2f}", f"{r['gaplan_ratio']:.2f}×",
                 r["runs"]] for r in data["loop"]]
        deviations = [float(run) / r["median_samples_per_s"] - 1 for r in data["loop"] for run in r["runs"].split()]
        return (table(["loop", "samples/s (median)", "gaplan / this", "runs"], ["---", "--:", "--:", "---"], rows)
                + f"\nIn this run a loop's runs lay between {min(deviations):+.0%} and {max(deviations):+.0%} of its "
                  f"median.\n")
    if key == "loss":
        rows = [[LOSSES.get(r["tool"], r["tool"]), f"{r['max_relative_difference']:.1e}"] for r in data["loss"]]
        return table(["tool", "max relative difference"], ["---", "--:"], rows)
    raise KeyError(key)


# ---- docs/data/profile_probe.json (examples/profile_probe.py) -----------------------------------------------------


def spread(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}–{high:.2f}"


def profile(data: dict, key: str | None) -> str:
    trials = data["trials"]
    sketches = [t for t in trials if t["fits"] and t["steps"] == 1]
    full = [t for t in trials if t["steps"] == 2]
    worker = data["worker"]
    imports = next(seconds for name, seconds in worker.items() if name.startswith("imports"))
    steps = sum((t["step 1"] or 0) + (t["step 2"] or 0) for t in trials)
    parts = " / ".join(spread([t[name] for t in trials]) for name in ("fork", "budget", "model build", "optimizer states"))
    rows = [["the caller imports gaplan (no torch)", f"{data['import gaplan']:.2f}"],
            ["worker start to ready: python, torch, transformers and the model's code",
             f"{worker['start to ready']:.2f} (imports {imports:.2f})"],
            ["per trial: fork / budget / model build / optimizer states", parts],
            ["per trial: the steps (sketches 1, the rest 2)",
             f"{spread([t['step 1'] for t in sketches])} (sketch), "
             f"{spread([t['step 1'] + t['step 2'] for t in full])} (full)"],
            ["per trial, in the worker", f"{spread([t['in the worker'] for t in sketches])} (sketch), "
                                         f"{spread([t['in the worker'] for t in full])} (full)"],
            [f"the whole probe: {len(trials)} trials, `{tried(trials)}`, B\\* = {data['edge']}",
             f"{data['probe wall']:.2f}, of which the measured steps {steps:.2f}"]]
    m = data["machine"]
    return (table(["part", "seconds"], ["---", "--:"], rows)
            + f"\nOn {data['date']}, {m['cpu']}, {m['cores']} cores, torch {m['torch']}: `{data['made_by']}`.\n")


def levers(data: dict, key: str | None) -> str:
    """levers.md: B* under the budget, the peak and the step's time of each checkpointing choice and of --compile."""
    rows = data["rows"]
    base = rows["off"]["step_cpu_seconds"][-1]
    names = {"off": "`--grad-checkpointing off`", "every:2": "`--grad-checkpointing every:2`",
             "on": "`--grad-checkpointing on`", "compile": "`--compile` (checkpointing off)"}
    lines = [[label, str(rows[name]["edge"]) if "edge" in rows[name] else "not probed", mib(rows[name]["peak_bytes"]),
              f"{rows[name]['step_seconds'][-1]:.2f}", f"{rows[name]['step_cpu_seconds'][-1]:.2f}",
              f"{rows[name]['step_cpu_seconds'][-1] / base:.2f}x"] for name, label in names.items()]
    m = data["machine"]
    return (table(["lever", f"B\\* under {data['budget']}", f"MiB at micro-batch {data['micro_batch']}",
                   "step s (wall)", "step s (CPU)", "CPU time vs off"], ["---", "--:", "--:", "--:", "--:", "--:"], lines)
            + f"\nOn {data['date']}, {m['cpu']}, {m['cores']} cores shared with other jobs (the wall times are "
              f"noisy), torch {m['torch']}, {data['model']} at seq {data['seq_len']}: `{data['made_by']}`.\n")


def zoo_optimizers(data: dict, key: str | None) -> str:
    """levers.md: the estimate's error against real CPU trials on the zoo's families, for each optimizer."""
    small, large = (str(size) for size in data["sizes"])
    lines, worst = [], (0.0, "")
    for row in data["rows"]:
        est, meas = row["estimated"], row["measured"]
        errors = [(est[s] - meas[s]) / meas[s] for s in (small, large)]
        slopes = [(peaks[large] - peaks[small]) / (int(large) - int(small)) / 2**20 for peaks in (est, meas)]
        lines.append([row["family"], f"`{row['optimizer']}`", *(f"{100 * e:+.2f}%" for e in errors),
                      f"{slopes[0]:.3f} vs {slopes[1]:.3f}"])
        worst = max(worst, *((abs(e), f"{row['family']} with `{row['optimizer']}` at micro-batch {s}")
                             for e, s in zip(errors, (small, large), strict=True)))
    return (table(["family", "optimizer", f"peak at {small}", f"peak at {large}",
                   "activations per sample, estimated vs measured (MiB)"], ["---", "---", "--:", "--:", "---"], lines)
            + f"\nAll {2 * len(lines)} peaks are within {100 * worst[0]:.2f}% (the largest: {worst[1]}). On "
              f"{data['date']}, {data['machine']}, torch {data['torch']}, transformers {data['transformers']}, "
              f"bitsandbytes {data['bitsandbytes']}, {data['threads']} threads, seq {data['seq_len']}, full "
              f"fine-tuning: `{data['command']}` (about 15 minutes).\n")


def chunked_loss(data: dict, key: str | None) -> str:
    """levers.md: the held-out check of --loss chunked (a Llama with a 32k vocabulary): B* both ways, the weights."""
    probes, shape, m = data["probes"], data["model"], data["machine"]
    lines = [[f"`--loss {loss}`", str(run["edge"]), " ".join(f"{b}{'' if fits else 'x'}" for b, fits in run["trials"])]
             for loss, run in probes.items()]
    differences = data["weights"]["largest_difference"]
    return (table(["loss", f"B\\* under {data['budget']}", "trials"], ["---", "--:", "---"], lines)
            + f"\nB\\* grows {probes['chunked']['edge'] / probes['plain']['edge']:.2f}x. After "
              f"{data['weights']['steps']} steps of micro-batches {' + '.join(map(str, data['weights']['micro_batches']))}"
              f", the largest weight difference between the two losses, over its tensor's scale: "
              + ", ".join(f"{d:.1e} with {opt.upper() if opt == 'sgd' else 'AdamW'}" for opt, d in differences.items())
              + f". Llama, {shape['layers']} layers x {shape['hidden']}, heads {shape['heads']}, vocabulary "
              f"{shape['vocab']:,}, seq {shape['seq_len']}. On {data['date']}, {m['cpu']}, {m['cores']} cores, torch "
              f"{m['torch']}: `{data['made_by']}`.\n")


def adaptive_rule(data: dict, key: str) -> str:
    """adaptive.md: where the adaptive rule stops (``replay``) and its error rate and delay (``rates``)."""
    if key == "replay":
        rows = [[str(r["steps"]), f"{r['noise_scale']:g}", str(r["rule_level"]), f"{r['past']} of {r['seeds']}",
                 f"{r['reached']} of {r['seeds']}", ", ".join(f"{e}: {n}" for e, n in r["finals"].items())]
                for r in data["replay"]]
        return table(["steps", "known B_noise", "the rule stops at", "runs that went past it", "reached it",
                      f"final E over the {data['replay'][0]['seeds']} seeds"],
                     ["--:", "--:", "--:", "--:", "--:", "---"], rows)
    if key == "rates":
        rows = [[str(r["level"]), f"{r['margin']:g}", f"{r['noise_scale']:g}", f"{r['grew']} of {r['seeds']}",
                 f"{r['median_steps']:g}"] for r in data["rates"]]
        return table(["E", "B_noise / 2E", "B_noise", f"doubled within {data['rates'][0]['steps']} steps",
                      "median steps to double"], ["--:", "--:", "--:", "--:", "--:"], rows)
    raise KeyError(key)


def published_gpu(data: dict, key: str | None) -> str:
    """The estimate vs published GPU peaks: the table examples/published_gpu_check.py prints."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("published_gpu_check", ROOT / "examples" / "published_gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render_table(data) + "\n"


RENDERERS = {"docs/data/probes.json": lambda data, key: probe_sentence(data, key) if key else probe_runs(data, key),
             "reports/peers/peers.json": peers, "docs/data/profile_probe.json": profile, "docs/data/levers.json": levers,
             "docs/data/zoo_optimizers.json": zoo_optimizers, "docs/data/chunked_loss.json": chunked_loss,
             "docs/data/adaptive_rule.json": adaptive_rule,
             "docs/data/published_gpu_results.json": published_gpu}


def blocks(page: pathlib.Path) -> list[re.Match]:
    return list(BLOCK.finditer(page.read_text()))


def render(path: str, key: str | None) -> str:
    return RENDERERS[path](load(path), key)


GENERATED = [(page, match.group(1), match.group(2)) for page in DOCS for match in blocks(page)]


def test_the_docs_have_generated_blocks_from_every_measurement_file():
    assert {path for _, path, _ in GENERATED} == set(RENDERERS), GENERATED


@pytest.mark.parametrize("page,path,key", GENERATED,
                         ids=[f"{p.name}:{path}:{key or ''}" for p, path, key in GENERATED])
def test_each_generated_block_is_what_its_file_renders_to(page, path, key):
    in_page = next(m.group(3) for m in blocks(page) if (m.group(1), m.group(2)) == (path, key))
    assert in_page == render(path, key), (f"{page.name}: the block from {path} {key or ''} differs from its file; "
                                          f"re-render with `python tests/test_docs_numbers.py --write`")


def test_a_changed_measurement_renders_differently():
    """The comparison is not empty: a file's number shows in what it renders to."""
    data = load("docs/data/probes.json")
    run = data["probes"]["seq32-256MiB-plain"]
    before = probe_sentence(data, "seq32-256MiB-plain")
    run["edge"] += 1
    assert probe_sentence(data, "seq32-256MiB-plain") != before


def test_a_changed_lever_measurement_renders_differently():
    data = load("docs/data/levers.json")
    before = levers(data, None)
    data["rows"]["every:2"]["edge"] += 1
    assert levers(data, None) != before


def test_a_changed_zoo_measurement_renders_differently():
    data = load("docs/data/zoo_optimizers.json")
    before = zoo_optimizers(data, None)
    data["rows"][0]["measured"]["2"] += 2**20
    assert zoo_optimizers(data, None) != before


def test_a_changed_adaptive_measurement_renders_differently():
    data = load("docs/data/adaptive_rule.json")
    before = adaptive_rule(data, "rates")
    data["rates"][0]["grew"] += 1
    assert adaptive_rule(data, "rates") != before


def test_the_adaptive_pages_prose_is_its_file():
    """adaptive.md's sentences under its two tables quote docs/data/adaptive_rule.json."""
    data = load("docs/data/adaptive_rule.json")
    rates = {(r["level"], r["margin"]): r for r in data["rates"]}
    text = " ".join((ROOT / "docs" / "adaptive.md").read_text().split("What this says:", 1)[1].split("## ", 1)[0].split())
    assert (f"{rates[2, 0.75]['grew']} runs in {rates[2, 0.75]['seeds']} doubled within {rates[2, 0.75]['steps']} "
            f"steps at `E = 2`, {rates[8, 0.75]['grew']} in {rates[8, 0.75]['seeds']} at `E = 8`") in text
    at_one = sorted(rates[level, 1.0]["grew"] for level in (2, 8))
    assert f"Exactly at the boundary (`r = 1`), {at_one[0]}-{at_one[1]} in 100 did" in text
    medians = ", ".join(f"{round(rates[8, m]['median_steps'] + 1e-9)} at {m:g}" for m in (1.5, 2.0, 3.0))
    assert (f"at `E = 8`, a median of {round(rates[8, 1.3]['median_steps'])} steps at `r = 1.3`, {medians}") in text
    assert rates[2, 2.0]["seeds"] - rates[2, 2.0]["grew"] == pytest.approx(rates[2, 2.0]["seeds"] / 4, abs=3)
    assert "a quarter of the runs at `r = 2` had not doubled after 300 steps" in text
    from gaplan.plan.growth_test import MIN_STEPS  # the rule's floor, not a measurement

    assert f"The minimum is {MIN_STEPS} steps at a batch" in text
    assert min(r["median_steps"] for r in data["rates"]) >= MIN_STEPS


# ---- the documented probes, replayed --------------------------------------------------------------------------------


def replay(run: dict) -> tuple[list[tuple[int, int]], int]:
    """Today's search, fed the recorded trials: the (micro-batch, optimizer steps) it asks for, and its edge."""
    from gaplan.core.trial import Trial
    from gaplan.plan.search import find_edge

    recorded = list(run["trials"])
    asked: list[tuple[int, int]] = []

    def measure(micro_batch: int, steps: int = 2) -> Trial:
        asked.append((micro_batch, steps))
        if not recorded or recorded[0]["micro_batch"] != micro_batch:
            raise AssertionError(f"the search now asks for {micro_batch} where `{run['command']}` tried "
                                 f"{tried(run['trials'])}: re-run examples/documented_probes.py")
        trial = recorded.pop(0)
        return Trial(micro_batch, trial["fits"], trial["peak_bytes"], completed_steps=trial["completed_steps"],
                     micro_steps_peak_bytes=trial["micro_steps_peak_bytes"])

    result = find_edge(measure, run["limit_bytes"], start=run["trials"][0]["micro_batch"],
                       max_batch=run["search_cap"], sketch=lambda micro_batch: measure(micro_batch, 1))
    assert not recorded, f"the search now stops before {tried(recorded)}"
    return asked, result.edge


@pytest.mark.parametrize("name", sorted(load("docs/data/probes.json")["probes"]))
def test_the_search_asks_for_the_recorded_trials_and_reaches_the_recorded_edge(name):
    run = load("docs/data/probes.json")["probes"][name]
    asked, edge = replay(run)
    assert [b for b, _ in asked] == [t["micro_batch"] for t in run["trials"]]
    # A trial that fitted ran as many steps as the search asked for (a sketch one, a full trial two).
    assert [steps for (_, steps), t in zip(asked, run["trials"], strict=True) if t["fits"]] == \
        [t["completed_steps"] for t in run["trials"] if t["fits"]]
    assert edge == run["edge"]


@pytest.mark.parametrize("name", sorted(load("docs/data/probes.json")["probes"]))
def test_a_recorded_probes_budget_is_its_commands(name):
    """The budget the replay uses is the one the quoted command asks for (gaplan's default CPU budget without
    --memory-limit): a budget edited in the command alone fails here, in the file alone fails the replay."""
    from gaplan.core.constants import DEFAULT_CPU_BUDGET
    from gaplan.core.units import parse_bytes

    run = load("docs/data/probes.json")["probes"][name]
    # --memory-limit's value, or the loop script's positional budget (``probe_edges.py loop 512MiB``).
    limit = next((word for word in shlex.split(run["command"]) if re.fullmatch(r"\d+(\.\d+)?[KMGT]i?B", word)), None)
    assert run["limit_bytes"] == (parse_bytes(limit) if limit else DEFAULT_CPU_BUDGET), run["command"]


def test_a_changed_budget_changes_the_replayed_trials():
    run = load("docs/data/probes.json")["probes"]["seq32-256MiB-plain"]
    run["limit_bytes"] //= 2
    with pytest.raises(AssertionError, match="now asks for"):
        replay(run)


def _options(command: str) -> dict[str, str]:
    words = shlex.split(command)
    return {word: words[i + 1] for i, word in enumerate(words[:-1]) if word in ("--seq-len", "--memory-limit")}


SEEDED = sorted(name for name, run in load("docs/data/probes.json")["probes"].items()
                if run["command"].startswith("gaplan probe") and "--no-seed-from-estimate" not in run["command"])


@pytest.mark.heavy  # 7-16 s each on 2 cores (a traced estimate): kept out of the default run
@pytest.mark.slow
@pytest.mark.parametrize("name", SEEDED)
def test_a_seeded_probe_starts_at_todays_estimate(name):
    """The estimate is traced on fake tensors: the same on every machine, so the recorded seed must be today's."""
    from gaplan import WorkloadSpec
    from gaplan.core.units import parse_bytes
    from gaplan.workflows.probe import estimate_start

    run = load("docs/data/probes.json")["probes"][name]
    options = _options(run["command"])
    spec = WorkloadSpec(**({"seq_len": int(options["--seq-len"])} if "--seq-len" in options else {}))
    limit = parse_bytes(options["--memory-limit"]) if "--memory-limit" in options else None
    assert estimate_start(spec, "cpu", limit, 0.0, None, 1) == run["trials"][0]["micro_batch"], run["command"]


@pytest.mark.parametrize("page", ["README.md", "docs/probe.md"])
def test_the_sample_output_is_the_recorded_default_probe(page):
    """The sample output of `gaplan probe` (the default): the estimate's seed and B* are the recorded run's."""
    run = load("docs/data/probes.json")["probes"]["default-seeded"]
    sample = (ROOT / page).read_text().split("probing tiny-gpt2 (each trial", 1)[1].split("```", 1)[0]
    assert f"estimate: B* = {run['trials'][0]['micro_batch']} " in sample
    assert f"largest micro-batch that fits: {run['edge']} " in sample
    assert [int(line.split()[1]) for line in sample.splitlines() if line.strip().startswith("micro-batch")] == \
        [t["micro_batch"] for t in run["trials"]]


def test_every_example_the_readme_lists_is_run_by_a_test():
    readme = (ROOT / "README.md").read_text()
    paragraph = readme.split("Examples (each runs as written on CPU and is run by a test):", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"`examples/([\w.]+)`", paragraph)
    tests = "\n".join(path.read_text() for path in (ROOT / "tests").rglob("*.py") if path.name != pathlib.Path(__file__).name)
    assert len(listed) >= 10
    missing = [name for name in listed if f'"{name}"' not in tests and f"examples.{name.rsplit('.', 1)[0]}:" not in tests]
    assert not missing, f"listed in README.md's examples but run by no test: {missing}"


def write() -> None:
    """Re-render every generated block from its file."""
    for page in DOCS:
        text = page.read_text()
        new = BLOCK.sub(lambda m: f"<!-- generated: {m.group(1)}{' ' + m.group(2) if m.group(2) else ''} -->\n"
                                  f"{render(m.group(1), m.group(2))}<!-- end generated -->", text)
        if new != text:
            page.write_text(new)
            print(f"re-rendered {page.relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_docs_numbers.py --write")
    write()
