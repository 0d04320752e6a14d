"""The CLP compression coordinator: drives CLP compression jobs through Spider.

Packages, innermost first (dependencies point inwards only):

* ``lifecycle``: the job state machine (statuses, edges, actors) and its diagrams.
* ``store``: the database schema and the guarded transitions that persist the machine.
* ``config``: where the coordinator finds its database and data directory.
* ``cli``: the ``coordinator`` command.
"""

__version__ = "0.1.0"
