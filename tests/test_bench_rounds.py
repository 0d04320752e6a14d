"""``python -m bench --rounds N``: each goal judged on the median of its rounds (``bench.rounds``).

The figures here are made up: what is checked is the judging (the median, the goal's direction,
a round that failed or was not valid). ``tests/test_bench_smoke.py`` runs the command.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.rounds import median_rows
from bench.suite import P1_GOAL, P1B_GOAL, Row


def p1_row(ratio: float, *, valid: bool = True) -> dict[str, Any]:
    row = Row.judged(
        "P1 1,000 one-object jobs, SQLite", "…", goal=P1_GOAL, value=ratio, valid=valid
    )
    return dataclasses.asdict(row)


def p1b_row(rate: float) -> dict[str, Any]:
    return dataclasses.asdict(
        Row.judged("P1b lifecycle only, MariaDB", "…", goal=P1B_GOAL, value=rate)
    )


def test_a_goal_is_judged_on_the_median_not_on_one_round() -> None:
    rounds = [{"p1 (SQLite)": [p1_row(ratio)]} for ratio in (1.82, 1.45, 1.40)]
    ((case, each, median, goal, holds),) = median_rows(rounds)
    assert case == "P1 1,000 one-object jobs, SQLite"
    assert each == "1.82x, 1.45x, 1.40x"
    assert (median, goal, holds) == ("1.45x", "≤ 1.5x", "yes")
    # One round alone would have said no: that is the point.
    assert rounds[0]["p1 (SQLite)"][0]["holds"] == "no"


def test_an_at_least_goal_holds_when_the_median_reaches_it() -> None:
    rounds = [{"p1b (MariaDB)": [p1b_row(rate)]} for rate in (239, 323, 318, 296)]
    ((_, _, median, goal, holds),) = median_rows(rounds)
    assert (median, goal, holds) == ("307 jobs/s", "≥ 300 jobs/s", "yes")
    rounds = [{"p1b (MariaDB)": [p1b_row(rate)]} for rate in (239, 323, 296)]
    ((_, _, median, _, holds),) = median_rows(rounds)
    assert (median, holds) == ("296 jobs/s", "no")


def test_a_round_not_valid_fails_the_row_whatever_its_median() -> None:
    rounds = [
        {"p1 (SQLite)": [p1_row(1.2)]},
        {"p1 (SQLite)": [p1_row(1.3, valid=False)]},
        {"p1 (SQLite)": [p1_row(1.4)]},
    ]
    ((_, each, median, _, holds),) = median_rows(rounds)
    assert each == "1.20x, 1.30x (not valid), 1.40x"
    assert (median, holds) == ("1.30x", "no")


def test_a_failed_round_fails_the_row_and_is_shown() -> None:
    failed = {"case": "p1 (SQLite)", "figure": "failed (exit 1)", "holds": "no", "valid": False}
    rounds = [
        {"p1 (SQLite)": [failed]},  # the first round failed: the others' rows still count
        {"p1 (SQLite)": [p1_row(1.3)]},
        {"p1 (SQLite)": [p1_row(1.4)]},
    ]
    ((case, each, median, _, holds),) = median_rows(rounds)
    assert case == "P1 1,000 one-object jobs, SQLite"
    assert each == "failed, 1.30x, 1.40x"
    assert (median, holds) == ("1.35x", "no")


def test_rows_keep_their_runs_apart() -> None:
    rounds = [
        {"p1 (SQLite)": [p1_row(1.2)], "p1b (MariaDB)": [p1b_row(350)]},
        {"p1 (SQLite)": [p1_row(1.6)], "p1b (MariaDB)": [p1b_row(250)]},
    ]
    summary = median_rows(rounds)
    assert [row[1] for row in summary] == ["1.20x, 1.60x", "350 jobs/s, 250 jobs/s"]
    assert [row[2] for row in summary] == ["1.40x", "300 jobs/s"]
