"""The ``gaplan`` command line: parses options, calls the library (:mod:`gaplan.workflows.probe`), prints. Nothing else.

    gaplan probe                          # largest micro-batch that fits + plan, built-in model
    gaplan probe --model tiny-llama --seq-len 512 --memory-limit 2GiB --effective-batch 256
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from typing import Any

import click

from gaplan.cli.config_file import JSON_ASKED, GaplanCommand
from gaplan.cli.field_options import sectioned
from gaplan.core.errors import GaplanError, is_rank_own, is_user_code
from gaplan.core.interrupt import catching_signals, received
from gaplan.core.options import OUTPUT, OptionError
from gaplan.core.options import flag as flag_of_name
from gaplan.core.version import __version__

# The commands, each imported when it is invoked (or listed by --help): a command's options are built from its
# dataclasses' fields, so `gaplan train` does not pay for importing every other command's.
COMMANDS = {"probe": "gaplan.cli.probe:probe", "train": "gaplan.cli.train:train_command",
            "bench": "gaplan.cli.bench:bench_command", "estimate": "gaplan.cli.estimate:estimate_command",
            "plan": "gaplan.cli.plan:plan_command"}


def _tell_torchrun(line: str) -> None:
    """Under torchrun, a rank's one line goes into the error file torchrun reads, so its failure summary names it
    as the root cause (instead of "To enable traceback see ...")."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        with contextlib.suppress(OSError):
            with open(path, "w", encoding="utf-8") as handle:
                # The form torchrun's own error handler writes, so torchrun reads it without a warning.
                json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                      "timestamp": str(int(time.time()))}}}, handle)


class GaplanGroup(click.Group):
    """Turns every :class:`GaplanError` into one line on stderr and exit status 2; loads :data:`COMMANDS` lazily."""

    command_class = GaplanCommand  # --config and --print-config on every command

    def list_commands(self, ctx: click.Context | None = None) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context | None, name: str) -> click.Command | None:
        if name in COMMANDS and name not in self.commands:
            import importlib

            module, attribute = COMMANDS[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return self.commands.get(name)

    def invoke(self, ctx: click.Context) -> Any:
        with catching_signals():
            try:
                done = super().invoke(ctx)
            except GaplanError as exc:
                if received():  # the signal came first: a trial worker it ended reads as a failure
                    self._interrupted(ctx)
                if ctx.params.get("debug"):  # what raised it, through the exceptions chained to it (a disk fault)
                    click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
                line = f"gaplan: {self._message(exc, ctx)}"
                if is_user_code(exc) and not ctx.params.get("debug"):  # the user's code raised: its traceback helps
                    line += " (--debug shows the traceback)"
                # Under torchrun rank 0 says what every rank raises alike, and a rank its own failure; all exit 2.
                if int(os.environ.get("RANK", "0")) == 0 or is_rank_own(exc):
                    click.echo(line, err=True)
                    if ctx.meta.get(JSON_ASKED):  # stdout holds JSON whatever the outcome: a consumer reads why
                        click.echo(json.dumps({"error": line.removeprefix("gaplan: "), "exit_status": 2}))
                _tell_torchrun(line)
                ctx.exit(2)
            except click.UsageError as exc:  # click's own parse errors (a bad value, an unknown flag): one line too
                where = exc.ctx.command_path if exc.ctx is not None else f"{ctx.command_path} {ctx.invoked_subcommand}"
                click.echo(f"gaplan: {exc.format_message()} (see {where} --help)", err=True)
                ctx.exit(2)
            except KeyboardInterrupt:
                self._interrupted(ctx)
            if received():  # a signal swallowed on the way (a destructor's, a callback's) is still an interruption
                self._interrupted(ctx)
            return done

    @staticmethod
    def _interrupted(ctx: click.Context) -> None:
        """SIGINT and SIGTERM end every command alike: one line, exit 130 (a train checkpoints first)."""
        click.echo(f"gaplan: interrupted ({received() or 'SIGINT'})", err=True)
        ctx.exit(130)

    def _message(self, exc: GaplanError, ctx: click.Context) -> str:
        """The error's line; an option the library named by its field is named by the command's flag for it."""
        if not isinstance(exc, OptionError):
            return str(exc)
        command = self.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
        flags = {param.name: param.opts[0] for param in (command.params if command else [])
                 if isinstance(param, click.Option)}
        return exc.for_cli(lambda name: flags.get(name) or flag_of_name(name))


@click.group(cls=GaplanGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gaplan")
@click.option("--debug", is_flag=True, envvar="GAPLAN_DEBUG",
              help="On an error, print its traceback and the exceptions chained to it before its one line "
                   "(also GAPLAN_DEBUG=1).")
def main(debug: bool) -> None:
    """gaplan: the largest micro-batch that fits, the accumulation plan, and training with the exact loss.

    \b
    Examples:
      gaplan probe                                  # built-in small causal LM, CPU budget 1 GiB
      gaplan probe --model tiny-llama --seq-len 512 --memory-limit 2GiB --effective-batch 256
      gaplan probe --model mypkg.models:make_resnet --memory-limit 1GiB --json
      gaplan probe --report                         # + throughput, memory breakdown, report.md/html
      gaplan train --effective-batch 256            # probe (or cached), then train with accumulation
      gaplan bench --effective-batch 256            # the plan vs other splits vs a true large batch
      gaplan report reports/<run>                   # rebuild a run folder's report from its files
    """


@main.command(name="report")
@click.argument("run_dir", metavar="DIR")
@sectioned(OUTPUT, "--json", "as_json", is_flag=True, help="Print the files written as JSON.")
def report_command(run_dir: str, as_json: bool) -> None:
    """Rebuild report.md, report.html, probe.csv and the PNGs of a run folder from its CSV/JSON alone.

    Needs no model and no device: copy a run folder anywhere and rebuild its report.

    \b
    Examples:
      gaplan report reports/probe-tiny-gpt2-20261129-101500
      gaplan report reports/<run> --json
    """
    from gaplan.report.write import write_report

    written = write_report(run_dir)
    if as_json:
        click.echo(json.dumps({"run_dir": run_dir, "files": written.files}))
        return
    click.echo(f"wrote {', '.join(written.files)} in {run_dir}")




def run() -> None:
    """The ``gaplan`` command (and ``python -m gaplan``): :func:`main`, then a teardown no late signal changes."""
    from gaplan.core.interrupt import exit_on_late_signals

    try:
        main(prog_name="gaplan")
    except SystemExit as done:  # click's standalone mode ends every command so
        exit_on_late_signals(done.code)
        raise


if __name__ == "__main__":
    run()
