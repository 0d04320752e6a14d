"""CLP's Spider task package ``clp``: ``compression::clp_s_s3_compress``, ``compression::commit``
and the coordinator's ``compression::cleanup`` (run by Spider after a cancel).

An engine loads it through the factory ``coordinator.engine.tasks.registry:clp_package``: Spider's
``(package, task_func)`` pairs mapped to Python callables, each decoding its inputs and encoding its
outputs with the task I/O wire format.
"""
