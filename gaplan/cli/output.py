"""How the ``gaplan`` commands print: result lines (:mod:`gaplan.report.result_text`) on stdout, progress on stderr,
the training bar. No torch."""

from __future__ import annotations

import sys

import click


def echo_lines(lines: list[str]) -> None:
    """Result lines on stdout."""
    click.echo("\n".join(lines))


def same_terminal() -> bool:
    """True when stdout and stderr are one terminal: lines shown live on stderr are not repeated on stdout."""
    return sys.stdout.isatty() and sys.stderr.isatty()


class ProgressBar:
    """A tqdm bar over optimizer steps on stderr, created at the first step (on rank 0 only, where steps report);
    where stderr is no terminal, a line every tenth of the run instead."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.bar = total, enabled, None

    def step(self, log) -> None:
        if not self.enabled:
            return
        if not sys.stderr.isatty():  # a log file or a pipe: lines it can read, not a bar's carriage-return frames
            every = max(1, round(self.total / 10))
            if log.step % every == 0 or log.step == self.total:
                click.echo(f"step {log.step}/{self.total}: loss {log.loss:.4f}, {log.samples_per_s:.1f} samples/s",
                           err=True)
            return
        if self.bar is None:
            from tqdm import tqdm

            # No monitor thread: started under a run's CPU budget, its stack took 8 MiB of it (a 2-rank DDP run at
            # micro-batch 16 under 160 MiB ran out of memory with the bar and trained with --quiet, 2026-12-07).
            tqdm.monitor_interval = 0
            self.bar = tqdm(total=self.total, initial=log.step - 1, desc="train", unit="step", file=sys.stderr,
                            dynamic_ncols=True)
        self.bar.set_postfix(loss=f"{log.loss:.4f}", samples_s=f"{log.samples_per_s:.1f}",
                             tokens_s=f"{log.tokens_per_s:.0f}")
        self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        elif self.enabled:
            click.echo(text, err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class BenchProgress:
    """What a benchmark is about to do and its expected duration, then a bar per split (a line per timed run
    where stderr is no terminal)."""

    def __init__(self, say, live: bool) -> None:
        self.say, self.live, self.bars = say, live, {}
        self.outlook, self.started, self.rounds_seen = None, 0.0, 0

    def start(self, outlook) -> None:
        import time

        self.outlook, self.started, self.rounds_seen = outlook, time.perf_counter(), 0
        self.say(outlook.describe() + " ...")
        if not self.live:
            return
        from tqdm import tqdm

        width = max(len(label) for label in outlook.labels)
        self.bars = {label: tqdm(total=outlook.settings.max_rounds, desc=f"  {label:>{width}}", unit="round",
                                 position=index, file=sys.stderr, dynamic_ncols=True, leave=True)
                     for index, label in enumerate(outlook.labels)}

    def trial(self, round_number: int, label: str, rate: float | None) -> None:
        if round_number == 2 and self.rounds_seen == 1 and self.outlook is not None:
            self._after_the_first_round()
        self.rounds_seen = round_number
        speed = "did not run" if rate is None else f"{rate:.1f} samples/s"
        bar = self.bars.get(label)
        if bar is None:
            self.say(f"  round {round_number}  {label:>18}  {speed}")
            return
        bar.set_postfix_str(speed)
        bar.update(1)

    def _after_the_first_round(self) -> None:
        """The forecast again, from the first round's own time (the first came from the probe's trials)."""
        import time

        took = time.perf_counter() - self.started
        settings = self.outlook.settings
        least = min(took * settings.min_rounds, settings.time_budget_s + took)
        line = f"round 1 took {took:.0f} s: about {least:.0f} s for the {settings.min_rounds} rounds at least"
        if self.bars:
            next(iter(self.bars.values())).write(line, file=sys.stderr)
        else:
            self.say(line)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars = {}
