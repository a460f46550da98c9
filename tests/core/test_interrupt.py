"""SIGINT and SIGTERM end a command alike, and a swallowed one still stops every write (:mod:`gaplan.core.interrupt`)."""

import os
import signal

import click
import pytest
from click.testing import CliRunner

from gaplan.cli.main import GaplanGroup
from gaplan.core.atomic_write import atomic_write_text
from gaplan.core.interrupt import catching_signals, raise_if_interrupted, received


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_swallowed_on_the_way_still_stops_every_write(tmp_path, sig):
    before = signal.getsignal(sig)
    with catching_signals():
        try:
            os.kill(os.getpid(), sig)
        except KeyboardInterrupt:
            pass  # swallowed, as a destructor or a callback would
        assert received() == signal.Signals(sig).name
        with pytest.raises(KeyboardInterrupt):
            atomic_write_text(str(tmp_path / "plan.json"), "{}")
        with pytest.raises(KeyboardInterrupt):
            raise_if_interrupted()
    assert not (tmp_path / "plan.json").exists() and os.listdir(tmp_path) == []
    assert signal.getsignal(sig) is before  # the handlers before it are back
    assert received() is None  # and the next command starts clean
    atomic_write_text(str(tmp_path / "plan.json"), "{}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_command_that_swallowed_a_signal_exits_130_with_one_line(sig):
    @click.group(cls=GaplanGroup)
    def group():
        pass

    @group.command()
    def work():
        try:
            os.kill(os.getpid(), sig)
        except KeyboardInterrupt:
            pass  # lost on the way: the command goes on to its end
        click.echo("done")

    result = CliRunner().invoke(group, ["work"])
    assert result.exit_code == 130
    assert result.stderr.strip().splitlines()[-1] == f"gaplan: interrupted ({signal.Signals(sig).name})"
