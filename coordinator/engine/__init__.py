"""An implementation of the Spider port, not part of the coordinator's core.

``embedded/`` is a Spider-compatible engine that keeps its state in the coordinator's database and
runs task processes itself; ``grpc_server`` serves it over Spider's gRPC protocol; ``tasks/`` is the
task package its workers run (compress with ``clp-s``, commit, cleanup). The service loop never
imports this package: it speaks to whatever engine it is given through ``coordinator.spider.port``,
and only the composition root (``coordinator.runtime``, the CLI) chooses this one.
"""
