"""The CLP compression coordinator: drives CLP compression jobs through Spider.

The layout, innermost first. Dependencies point inwards only: each part imports only parts listed
before it (the README's "Layout" has the table of what each may import).

* Base modules, in this order: ``errors`` (``CoordinatorError``, the root of everything a user
  or an operator can cause), ``zstd_frames`` (zstd read as Spider and CLP read it), ``serde`` (Rust
  ``serde``/``rmp_serde``-compatible structs), ``task_io`` (the values CLP's Spider tasks take and
  return), ``partition`` (CLP's partitioning and input checks), ``job_config`` (the
  ``compression_jobs.clp_config`` blob); beside them ``metrics`` (every Prometheus metric, so
  each part counts its own events), which imports only ``prometheus_client``.
* ``spider``: the Spider port (the one interface to Spider), execution policies, the task graph,
  the wire formats, and the gRPC client and protocol definition of a Spider cluster.
* ``lifecycle``: the job state machine (statuses, edges, actors), the status numbers and stored
  forms, the reactions to Spider's outcomes, and the generated diagrams and tables.
* ``config``: CLP's ``clp-config.yaml`` models, the coordinator's own section, where the data
  directory and the database are.
* ``store``: the database schema, the guarded transitions that persist the machine, leases,
  archive records and publication.
* ``archive_storage``: where archives are stored (a local directory or S3) and removed.
* ``engine``: an implementation of the Spider port, not part of the core: the embedded engine
  (``engine.embedded``), its gRPC server (``engine.grpc_server``) and the task package its workers
  run (``engine.tasks``). ``service`` never imports it.
* ``service``: the loop that drives every job (claiming and leases, submission, outcomes) and what
  surrounds it (resource group, clean-up, logs, ingestion for ``submit``).
* ``runtime``: the composition root: a running coordinator assembled from its configuration
  (database, engine, settings).
* ``cli``: the ``coordinator`` command.

What the coordinator relies on from CLP and Spider, and the hazards cited as H1–H12, are in
``docs/`` (``clp.md``, ``spider.md``, ``hazards.md``).
"""

import functools

DISTRIBUTION = "clp-compression-coordinator"


@functools.cache
def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # a source tree on sys.path without installing it
        return "0+unknown"


def __getattr__(name: str) -> str:
    # ``__version__``, read from the installed distribution's metadata when first asked for: not
    # by every import of the package (start-up time, issue 14).
    if name == "__version__":
        return _installed_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__version__: str
"""The installed distribution's version: ``pyproject.toml`` is its one source."""
