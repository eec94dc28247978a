"""How the client commands print: rich tables for a person, JSON for a program (``--output json``).

A command builds rows as dicts (column name -> value) and calls ``emit``; JSON output is the rows as a list (or
the document given), so scripts get exactly what the table shows, with numbers as numbers and None as null.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

Row = dict[str, Any]


def emit(
    output: str,
    columns: Sequence[str],
    rows: Iterable[Row],
    *,
    title: str | None = None,
    document: Any = None,
) -> None:
    """Print ``rows`` as a table with ``columns`` (``output == "table"``), or as JSON: ``document`` if given,
    else the rows."""
    materialized = list(rows)
    if output == "json":
        print_json(materialized if document is None else document)
        return
    print_table(columns, materialized, title=title)


def print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_table(columns: Sequence[str], rows: Sequence[Row], *, title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False, header_style="bold")
    for column in columns:
        numeric = bool(rows) and all(isinstance(row.get(column), int | float) for row in rows)
        table.add_column(column.upper().replace("_", " "), justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(cell_text(row.get(column)) for column in columns))
    # No terminal (a pipe, a test): no colours and a width that never folds a line.
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 240)
    console.print(table)


def cell_text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)
