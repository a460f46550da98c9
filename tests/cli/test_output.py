"""gaplan.cli.output: the training bar starts no thread of its own (it is made under a run's CPU budget); with
--json a refusal is JSON on stdout too."""

import threading
from types import SimpleNamespace

import pytest

from gaplan.cli.output import ProgressBar


def test_the_training_bar_starts_no_monitor_thread(monkeypatch):
    """tqdm's monitor thread, started with the first bar, reserved an 8 MiB stack under a run's CPU budget: a 2-rank
    DDP train at micro-batch 16 under 160 MiB ran out of memory with the bar and trained with --quiet (2026-12-07)."""
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the bar is a terminal's
    bar = ProgressBar(total=3, enabled=True)
    try:
        bar.step(SimpleNamespace(step=1, loss=1.0, samples_per_s=2.0, tokens_per_s=3.0))
        assert bar.bar is not None
        assert not [t for t in threading.enumerate() if type(t).__name__ == "TMonitor"]
    finally:
        bar.close()


def test_where_stderr_is_no_terminal_the_run_says_a_line_every_tenth_not_a_bars_frames(capsys):
    """A log file of a run (stderr redirected) filled with tqdm's carriage-return frames."""
    bar = ProgressBar(total=20, enabled=True)
    for step in range(1, 21):
        bar.step(SimpleNamespace(step=step, loss=1.0 / step, samples_per_s=2.0, tokens_per_s=3.0))
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert bar.bar is None and "\r" not in "".join(lines)
    assert [line.split(":")[0] for line in lines] == [f"step {n}/20" for n in range(2, 21, 2)]
    assert lines[-1] == "step 20/20: loss 0.0500, 2.0 samples/s"


@pytest.mark.parametrize("args", [["estimate", "--memory-limit", "1MiB", "--json"],
                                  ["report", "/no/such/run", "--json"],
                                  ["train", "--seed", "-99999999999999999999", "--json"]])
def test_with_json_a_refusal_is_a_json_object_on_stdout_too(args):
    """stdout was empty on a refusal: a consumer that parses it read nothing and no reason."""
    import json

    from click.testing import CliRunner

    from gaplan.cli.main import main

    result = CliRunner().invoke(main, args)
    line = result.stderr.strip().splitlines()[-1]  # after any progress line
    assert result.exit_code == 2 and line.startswith("gaplan: "), result.output
    assert json.loads(result.stdout) == {"error": line.removeprefix("gaplan: "), "exit_status": 2}
    without = CliRunner().invoke(main, [a for a in args if a != "--json"])
    assert without.exit_code == 2 and without.stdout == "" and without.stderr.strip().splitlines()[-1] == line
