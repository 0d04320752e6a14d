"""CLP's Spider task package ``clp``: ``compression::clp_s_s3_compress``, ``compression::commit``
and the coordinator's ``compression::cleanup`` (run by Spider after a cancel). What CLP's own tasks
do, and so what these mirror, is in ``docs/clp.md``; archives are stored through
``coordinator.archive_storage``.

An engine loads it through the factory ``coordinator.engine.tasks.registry:clp_package``: Spider's
``(package, task_func)`` pairs mapped to Python callables, each decoding its inputs and encoding its
outputs with the task I/O wire format.
"""
