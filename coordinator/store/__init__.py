"""The database: schema, migrations, the guarded transitions of compression jobs, leases, and
the records and publication of archives. CLP's tables it reads and writes are in ``docs/clp.md``.
"""
