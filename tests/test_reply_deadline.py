"""An executor's reply is read against the instance's hard timeout
(``coordinator.engine.embedded.protocol.read_reply``).

An instance whose reply was written before its deadline ended in time, even when the manager's
thread reads it only after the deadline (the host was busy, the thread waited for the GIL): it
must not be killed and reported as a hard timeout. Before, ``read_reply`` gave up as soon as the
deadline had passed, without looking at what the pipe already held.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator

import pytest

from coordinator.engine.embedded.protocol import Reply, ReplyTimeout, read_reply, write_message


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    yield read_end, write_end
    os.close(read_end)
    os.close(write_end)


def test_a_reply_written_before_the_deadline_is_taken_after_it(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    with os.fdopen(os.dup(write_end), "wb") as stream:
        write_message(stream, Reply(outputs=[b"archive"]))
    assert read_reply(read_end, time.monotonic() - 1.0) == Reply(outputs=[b"archive"])


def test_an_incomplete_reply_past_the_deadline_is_a_timeout(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    with pytest.raises(ReplyTimeout):
        read_reply(read_end, time.monotonic() - 1.0)  # nothing written
    message = io.BytesIO()
    write_message(message, Reply(outputs=[b"archive"]))
    os.write(write_end, message.getvalue()[:-3])  # the rest never comes
    started = time.monotonic()
    with pytest.raises(ReplyTimeout):
        read_reply(read_end, started + 0.2)
    assert time.monotonic() - started >= 0.2
