"""The coordinator service: the loop that drives every ``s3_object_metadata`` job through the
lifecycle by reacting to Spider's outcomes, and what it needs around it.

The loop: ``coordinator`` (the scheduler: ``Coordinator.tick``) calls ``lease_keeper`` (claims and
leases), ``cancels`` (operators' cancel requests), ``submitter`` (prepare, register, record,
start) and ``outcomes`` (poll, react by ``coordinator.lifecycle.reactions``, roll back, clean
up); ``driven`` holds what they share (``Loop``: the driven jobs, Spider, the settings) and the
one way every move is made. Around it: resource group, preparation of a job, clean-up, logs,
outages, ingestion for ``submit``, an operator's cancel (``operator_cancel``), health checks
(``health``: ``coordinator health``) and the monitoring endpoint (``monitoring``: ``/metrics``,
``/healthz``, ``/readyz``). It speaks to Spider
only through ``coordinator.spider.port`` and never imports an engine; the composition root that
assembles it with one is ``coordinator.runtime``.
"""
