"""``gaplan probe --batch-by tokens``: the data's length profile, T*, tokens.json and lengths.png; ``train --token-plan``."""

import json
import shlex

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main

from ..conftest import SMALL_BUDGET, SMALL_SPEC, SMALL_THREADS
from ..token_corpus import write_long_tailed

# The session's small probe (seq 16): its workload, budget and threads, so it serves as the probe at the longest length.
SMALL = ["--model", SMALL_SPEC["model"], "--seq-len", str(SMALL_SPEC["seq_len"]), "--memory-limit",
         f"{SMALL_BUDGET // 2**20}MiB", "--device", "cpu", "--threads", str(SMALL_THREADS), "--tokenizer", "bytes"]


def invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.mark.heavy
@pytest.mark.slow
def test_probe_by_tokens_writes_t_star_and_the_profile(tmp_path, monkeypatch, small_probe):
    from gaplan.probing.cache import plan_cache_path
    from gaplan.runs.probe_result import save_probe
    from gaplan.workload.spec import WorkloadSpec

    monkeypatch.setenv("GAPLAN_CACHE_DIR", str(tmp_path / "cache"))
    # The probe at the longest length (16) is the session's, cached as gaplan would cache it: one probe runs here.
    save_probe(small_probe, plan_cache_path(WorkloadSpec(**SMALL_SPEC).validate(), "cpu", SMALL_BUDGET, SMALL_THREADS))
    data = write_long_tailed(tmp_path / "corpus.txt", 200, 10, 16, shortest=8)
    out = tmp_path / "run"
    result = invoke(["probe", *SMALL, "--data", data, "--batch-by", "tokens", "--granule", "16", "--json", "--quiet",
                     "--out", str(out)])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    tokens = json.loads((out / "tokens.json").read_text())
    budget, profile = tokens["token_budget"], tokens["profile"]
    assert printed["token_budget"] == budget
    assert (profile["count"], profile["shortest"], profile["longest"]) == (200, 8, 16)
    assert sum(count for _, count in tokens["length_counts"]) == 200
    t_star, granule = budget["token_budget"], budget["granule"]
    assert granule == 16 and t_star % granule == 0 and t_star >= profile["longest"]
    # T* packs no more samples of either extreme length than the probe found to fit ...
    assert t_star // budget["longest"] <= budget["long_edge"] and t_star // budget["shortest"] <= budget["short_edge"]
    # ... and one granule more packs one too many of one of them.
    over = t_star + granule
    assert over // budget["longest"] > budget["long_edge"] or over // budget["shortest"] > budget["short_edge"]
    # plan.json is the probe at the longest length; its B* is T*'s long edge.
    plan = json.loads((out / "plan.json").read_text())
    assert plan["max_micro_batch"] == budget["long_edge"]
    # Another probe in another process: the CPU edge moves by one sample with the address layout.
    assert abs(budget["long_edge"] - small_probe.max_micro_batch) <= 1
    assert plan["workload"]["seq_len"] == 16
    assert tokens["probes"]["shortest"]["max_micro_batch"] == budget["short_edge"]
    assert (out / "lengths.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The table output says T* (the probes are cached now), and the report gets the token section.
    table = invoke(["probe", *SMALL, "--data", data, "--batch-by", "tokens", "--granule", "16", "--out", str(out),
                    "--overwrite"])
    assert table.exit_code == 0, table.output
    assert f"T* = {t_star} tokens per micro-batch (granule 16)" in table.stdout
    assert "lengths    200 samples of 8 to 16 tokens" in table.stdout
    # The train command it prints trains as printed: this workload, this data, this T* (it said only
    # "gaplan train --batch-by tokens --token-plan ...", which the workload check then refused).
    printed_command = table.stdout.rstrip().splitlines()[-1].split("  (", 1)[1].rstrip(")")
    assert printed_command == (f"gaplan train --model tiny-gpt2 --seq-len 16 --data {data} --tokenizer bytes "
                               f"--batch-by tokens --token-plan {out / 'tokens.json'}")
    trained = invoke([*shlex.split(printed_command)[1:], "--steps", "1", "--threads", "1", "--quiet",
                      "--out", str(tmp_path / "trained")])
    assert trained.exit_code == 0, trained.output
    assert json.loads((tmp_path / "trained" / "train.json").read_text())["options"]["token_budget"] == t_star
    assert invoke(["report", str(out)]).exit_code == 0
    report = (out / "report.md").read_text()
    assert "## Token budget" in report and "![Sample lengths](lengths.png)" in report


def _token_plan(tmp_path, **changes):
    """A hand-made tokens.json (what probe --batch-by tokens writes, less what train does not read)."""
    from gaplan.workload.spec import WorkloadSpec

    record = {"workload": WorkloadSpec(model="tiny-gpt2", seq_len=16).to_dict(), "device": "cpu",
              "memory_limit_bytes": 160 * 2**20,
              "profile": {"count": 10, "shortest": 4, "longest": 16, "median": 6.0, "p90": 12.0, "p99": 16.0,
                          "mean": 7.0, "histogram": [[4, 16, 10]]},
              "token_budget": {"token_budget": 96, "granule": 16, "shortest": 4, "longest": 16, "short_edge": 30,
                               "long_edge": 6, "binding": "longest"}}
    record.update(changes)
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(record))
    return str(path)


BAD_INPUT = [
    (["probe", "--batch-by", "tokens"], "give --data"),
    (["probe", "--batch-by", "tokens", "--data", "x.txt", "--granule", "0"],
     "--granule must be a positive number of tokens (got 0)"),
    (["probe", "--data", "x.txt"], "--data applies to --batch-by tokens"),
    (["probe", "--batch-by", "tokens", "--data", "x.txt", "--report"], "--report applies to a probe by samples"),
    (["probe", "--batch-by", "tokens", "--data", "x.txt", "--world-size", "2"], "probes one device"),
    (["bench", "--batch-by", "tokens"], "give --data"),
    (["bench", "--batch-by", "tokens", "--data", "x.txt", "--granule", "0"], "--granule must be a positive"),
    (["bench", "--batch-by", "tokens", "--data", "x.txt", "--rounds", "0"], "--rounds must be a positive integer"),
    (["train", "--token-plan", "tokens.json"], "--token-plan needs --batch-by tokens"),
]


@pytest.mark.parametrize("args, message", BAD_INPUT)
def test_bad_input(tmp_path, args, message):
    out = tmp_path / "never"
    result = CliRunner().invoke(main, [*args, "--quiet", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()


@pytest.mark.parametrize("extra, changes, message", [
    (["--seq-len", "32"], {}, "was made for another workload (--seq-len 16 there, 32 here): give its workload, "
                              "--model tiny-gpt2 --seq-len 16"),
    (["--seq-len", "16", "--memory-limit", "1GiB"], {}, "was probed under a budget of 167772160 bytes"),
    (["--seq-len", "16", "--token-budget", "64"], {}, "--token-budget and --token-plan both give the token budget"),
    (["--seq-len", "16"], {"token_budget": "lots"}, "is not a gaplan token plan"),
])
def test_a_token_plan_for_another_run_is_refused(tmp_path, extra, changes, message):
    out = tmp_path / "never"
    result = CliRunner().invoke(main, ["train", "--batch-by", "tokens", "--token-plan", _token_plan(tmp_path, **changes),
                                       *extra, "--device", "cpu", "--quiet", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()
