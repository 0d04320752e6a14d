"""``coordinator lifecycle``: the lifecycle's tables (``coordinator.lifecycle.tables``) for a
terminal."""

from __future__ import annotations

import textwrap

from coordinator.lifecycle import tables as lifecycle_tables


def print_lifecycle() -> None:
    """Print the edges, the reactions, giving up and the stored forms as aligned tables."""
    print("Compression job lifecycle: the edges (state numbers in parentheses):")
    _print_table(
        (*lifecycle_tables.EDGE_HEADERS[:4], "why"),
        [(*row[:4], row[6]) for row in lifecycle_tables.edge_rows()],
    )
    print("\nReactions to Spider's final word, by the row's state:")
    _print_table(lifecycle_tables.REACTION_HEADERS, lifecycle_tables.reaction_rows())
    print("\nA job whose attempts ran out:")
    _print_table(lifecycle_tables.GIVING_UP_HEADERS, lifecycle_tables.giving_up_rows())
    print("\nStored in compression_jobs:")
    _print_table(lifecycle_tables.STORED_HEADERS, lifecycle_tables.stored_rows())
    print(
        "  Committed is written as 1 (coordinator.committed_status: running, the default) "
        "or 5 (distinct)"
    )


def _print_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Aligned columns; the last one wrapped to the terminal's width."""
    fixed = len(headers) - 1
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(fixed)]
    indent = sum(widths) + 2 * fixed
    for row in (headers, *rows):
        cells = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
        last = textwrap.wrap(row[fixed], width=max(40, 110 - indent)) or [""]
        print(f"  {cells}  {last[0]}")
        for line in last[1:]:
            print(" " * (indent + 2) + line)
