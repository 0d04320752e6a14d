"""A task package module whose import never ends (``test_fork_server``: a fork server stuck in its
start-up)."""

import time

time.sleep(3600)
