"""The docs' option tables, rendered from the commands themselves (so from the fields' metadata, written once): the
option reference of docs/options.md (one table per command, in its ``--help`` sections) and each command's options
that apply only somewhere (its page's "where each option applies").

``python -m gaplan.cli.reference docs/*.md`` re-renders the pages' generated blocks; a test fails when a page and
the commands differ.
"""

from __future__ import annotations

import re
import sys

import click

BLOCK = re.compile(r"(<!-- generated: gaplan\.cli\.reference\.(options_table|scope_table)\((\w+)\) -->\n)(.*?)"
                   r"(<!-- end generated -->)", re.DOTALL)


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


def conditional_options(name: str) -> dict[str, str]:
    """``{flag: where it applies}`` of ``gaplan NAME``'s options that do not apply everywhere (given elsewhere, each
    is refused in one line), in ``--help`` order."""
    from gaplan.cli.main import main

    command = main.get_command(None, name)
    return {param.opts[0]: param.applies for param in command.params if getattr(param, "applies", None)}


def scope_table(name: str) -> str:
    """:func:`conditional_options` as Markdown."""
    rows = [f"| `{flag}` | {_cell(where)} |" for flag, where in conditional_options(name).items()]
    return "\n".join(["| option | applies only |", "|---|---|", *rows]) + "\n"


def render_page(text: str) -> str:
    """``text`` with each generated block re-rendered from its command."""
    tables = {"options_table": options_table, "scope_table": scope_table}
    return BLOCK.sub(lambda m: m.group(1) + ("\n" if m.group(2) == "options_table" else "")
                     + tables[m.group(2)](m.group(3)) + ("\n" if m.group(2) == "options_table" else "") + m.group(5),
                     text)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as handle:
            page = handle.read()
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(render_page(page))
