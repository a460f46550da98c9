"""The option reference of docs/options.md, rendered from the commands themselves (so from the fields' help, written
once): one Markdown table per command, in its ``--help`` sections.

``python -m gaplan.cli.reference docs/options.md`` re-renders the page's generated blocks; a test fails when the page
and the commands differ.
"""

from __future__ import annotations

import re
import sys

import click

BLOCK = re.compile(r"(<!-- generated: gaplan\.cli\.reference\.options_table\((\w+)\) -->\n)(.*?)(<!-- end generated -->)",
                   re.DOTALL)


def options_table(name: str) -> str:
    """``gaplan NAME``'s options as Markdown: a table per ``--help`` section, each row the flag and its help."""
    from gaplan.cli.config_file import help_sections
    from gaplan.cli.main import main

    command = main.get_command(None, name)
    ctx = click.Context(command, info_name=name, **main.context_settings)  # -h too, as gaplan's own
    parts = []
    for section, records in help_sections(command, ctx).items():
        rows = [f"| `{_cell(flags)}` | {_cell(text)} |" for flags, text in records]
        parts.append(f"**{section}**\n\n| option | what it does |\n|---|---|\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"


def render_page(text: str) -> str:
    """``text`` with each generated block re-rendered from its command."""
    return BLOCK.sub(lambda m: m.group(1) + "\n" + options_table(m.group(2)) + "\n" + m.group(4), text)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    path = sys.argv[1]
    with open(path, encoding="utf-8") as handle:
        page = handle.read()
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render_page(page))
