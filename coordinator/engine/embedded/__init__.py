"""The embedded engine: Spider's job semantics in-process, tasks in worker processes.

``EmbeddedSpider`` implements the Spider port over the same RegisterJob payloads a Spider cluster
accepts. Its job records live in the database (``spider_engine_jobs``), so they survive a restart of
the process hosting it; each task instance runs in an executor subprocess owned by an execution
manager thread, as Spider's execution managers run theirs. ``docs/spider.md`` restates the
semantics it follows; ``coordinator.engine.grpc_server`` serves it over Spider's protocol.
"""
