"""The coordinator service: the loop that drives every ``s3_object_metadata`` job through the
lifecycle by reacting to Spider's outcomes (``coordinator.service.coordinator``), and what it needs
around it (resource group, preparation of a job, clean-up, logs, outages, ingestion for
``submit``, an operator's cancel). It speaks to Spider only through ``coordinator.spider.port``
and never imports an engine; the composition root that assembles it with one is
``coordinator.runtime``.
"""
