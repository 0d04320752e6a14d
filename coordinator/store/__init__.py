"""The database: schema, migrations and the guarded transitions of compression jobs."""
