"""``python -m coordinator`` is the ``coordinator`` command."""

from coordinator.cli.main import main

raise SystemExit(main())
