"""``python -m coordinator.engine.embedded``: one executor process (``executor.main``), whose
start-up runs with the cyclic garbage collector paused.

An executor's start-up is imports (SQLAlchemy, pydantic, the task packages: ~0.4-0.6 s of CPU
here, about 1 ms per job of a 1,000-job run with two executors), during which the collector runs
again and again over objects that all live as long as the process. Paused, the start-up took
about a quarter less CPU (median of 12 alternated pairs, 638 → 459 ms; issue 14);
``executor.main`` freezes what it built (later full collections skip it) and resumes the
collector before its first task.
"""

import gc

gc.disable()

from coordinator.engine.embedded.executor import main  # noqa: E402 (after the pause)

raise SystemExit(main())
