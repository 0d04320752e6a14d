"""The database: schema, migrations, the guarded transitions of compression jobs, leases, and
the records and publication of archives. CLP's tables it reads and writes are in ``docs/clp.md``.

One style throughout: module functions over an ``Engine`` or a ``Connection`` (a function given a
connection runs inside its caller's transaction), and ``JobStore`` for the guarded transitions and
reads of jobs. Time is injected one way: the store never reads the wall clock itself. A function
takes the instant from its caller (``now``, ``expires``, ``stored_before``); an object that
stamps rows on its own (``JobStore``, ``instances.Presence``) takes a ``Clock`` at construction,
``clock.utc_now`` by default, which tests replace.
"""
