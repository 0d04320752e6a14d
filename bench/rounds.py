"""Several rounds of the suite judged together: each goal on the median of its rounds.

This machine's speed moves by a third within an hour (``docs/performance.md``, rounds 14-18), so
one round's verdict on a ratio near its goal says as much about the hour as about the coordinator.
``python -m bench --rounds N`` runs every selected case N times, the cases alternated (round 1's
cases, then round 2's …: each round's floor and run measured together, as every case already
does), prints each round's table, then one table of each judged figure over the rounds, its
median and whether the median meets the goal. A round that failed, or whose run was not valid
(a job not Succeeded, a job submitted twice …), fails the row whatever its median.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.suite import Row, verdict
from coordinator.lifecycle.tables import markdown_table

HEADERS = ("case", "each round", "median", "goal", "holds")

RoundRows = Mapping[str, Sequence[Mapping[str, Any]]]
"""One round: each case's run (``p1 (SQLite)`` …) and the rows it printed, in order."""


def median_rows(rounds: Sequence[RoundRows]) -> list[tuple[str, str, str, str, str]]:
    """One row per judged row of each case's run: its figure in every round, the median, the
    goal, and whether the median holds (every round valid). The rows are those of the round in
    which the run judged the most (a run that failed prints one row, saying so, judging nothing).
    """
    summary = []
    for run in dict.fromkeys(run for round_rows in rounds for run in round_rows):
        template = max((round_rows.get(run, ()) for round_rows in rounds), key=_judged_rows)
        for index, shape in enumerate(template):
            judged = Row.from_json(shape)
            goal = judged.rule
            if goal is None:
                continue
            values: list[float] = []
            cells: list[str] = []
            valid = True
            for round_rows in rounds:
                rows = round_rows.get(run, ())
                row = Row.from_json(rows[index]) if index < len(rows) else None
                if row is None or row.value is None:
                    cells.append("failed")
                    valid = False
                    continue
                values.append(row.value)
                cells.append(goal.shown.format(row.value) + ("" if row.valid else " (not valid)"))
                valid = valid and row.valid
            median = statistics.median(values) if values else None
            summary.append(
                (
                    judged.case,
                    ", ".join(cells),
                    "—" if median is None else goal.shown.format(median),
                    goal.text,
                    verdict(median is not None and valid and goal.met(median)),
                )
            )
    return summary


def _judged_rows(rows: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for row in rows if row.get("value") is not None)


def median_table(rounds: Sequence[RoundRows]) -> str:
    return markdown_table(HEADERS, median_rows(rounds))
