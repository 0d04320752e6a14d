"""Fitting operator messages into status_msg: length and character set (H7, docs/hazards.md)."""

from __future__ import annotations

from coordinator.store.messages import fit_status_msg


def test_short_messages_are_kept() -> None:
    assert fit_status_msg("clp-s exited with 1") == "clp-s exited with 1"
    assert fit_status_msg("x" * 512) == "x" * 512


def test_long_messages_are_cut_with_a_marker() -> None:
    fitted = fit_status_msg("y" * 600)
    assert len(fitted) == 512
    assert fitted == "y" * 511 + "…"


def test_characters_the_charset_lacks_are_replaced() -> None:
    assert (
        fit_status_msg("disk 💾 full", charset="utf8mb3") == "disk \N{REPLACEMENT CHARACTER} full"
    )
    assert fit_status_msg("disk 💾 full", charset="utf8mb4") == "disk 💾 full"
    assert fit_status_msg("café 💾", charset="latin1") == "café ?"
    assert fit_status_msg("z" * 600, charset="ascii")[-3:] == "..."
    assert len(fit_status_msg("z" * 600, charset="ascii")) == 512
