"""``python -m coordinator.engine.embedded``: the executors' fork server (``forkserver.main``),
whose start-up runs with the cyclic garbage collector paused.

The server's start-up is imports (SQLAlchemy, pydantic, the task packages: ~0.3-0.45 s of CPU
here), during which the collector runs again and again over objects that all live as long as the
process. Paused, an executor's start-up took about a quarter less CPU (median of 12 alternated
pairs, 638 → 459 ms; issue 14); ``forkserver.main`` freezes what it built (later full collections
skip it, in the server and in every executor forked from it) and resumes the collector.
"""

import gc

gc.disable()

from coordinator.engine.embedded.forkserver import main  # noqa: E402 (after the pause)

raise SystemExit(main())
