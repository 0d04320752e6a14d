"""Fitting operator-facing text into ``compression_jobs.status_msg`` (``VARCHAR(512)``).

Under MariaDB's default strict ``sql_mode`` an over-long value, or a character the column's charset
cannot hold, fails the whole ``UPDATE`` and the status change with it (hazard H7,
``docs/hazards.md``). So every message is fitted before it is written, never after an error.
"""

from __future__ import annotations

from coordinator.store.schema import STATUS_MSG_MAX_CHARS

ELLIPSIS = "…"
_REPLACEMENT = "\N{REPLACEMENT CHARACTER}"


def fit_status_msg(
    text: str, *, charset: str = "utf8mb4", max_chars: int = STATUS_MSG_MAX_CHARS
) -> str:
    """``text`` made storable: characters the charset lacks replaced, cut to ``max_chars``.

    ``utf8mb3``/``utf8`` columns cannot store characters outside the Basic Multilingual Plane (they
    become U+FFFD); ``latin1`` and other single-byte charsets get ``?`` for what they cannot encode.
    A cut message ends with ``…`` so a reader knows it was cut.
    """
    charset = charset.lower()
    text = _storable(text, charset)
    if len(text) <= max_chars:
        return text
    marker = ELLIPSIS if _storable(ELLIPSIS, charset) == ELLIPSIS else "..."
    return text[: max_chars - len(marker)] + marker


def _storable(text: str, charset: str) -> str:
    if charset == "utf8mb4":
        return text
    if charset in ("utf8mb3", "utf8"):
        return "".join(ch if ord(ch) <= 0xFFFF else _REPLACEMENT for ch in text)
    codec = {"latin1": "cp1252", "ascii": "ascii"}.get(charset, "ascii")
    return text.encode(codec, errors="replace").decode(codec)
