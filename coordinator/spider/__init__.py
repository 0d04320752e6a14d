"""Spider, as the coordinator sees it: the port and the formats Spider accepts.

* ``port``: ``SpiderPort``, the one interface through which the coordinator drives Spider (job
  states, calls, typed errors), and the helpers that make Spider's calls safe (``start_if_ready``,
  ``cancel_if_safe``); ``measured``: ``MeasuredSpider``, the port with every call timed and
  every error counted (``coordinator.metrics``);
* ``policy``, ``task_graph``, ``wire``: execution policies, the task graph and Spider's frames,
  checked by Spider's own rules;
* ``grpc``: Spider's protocol definition, its generated stubs and ``GrpcSpider``, the port over
  gRPC for a Spider cluster.

The embedded engine, another implementation of the port, is ``coordinator.engine``. What the code
relies on from Spider is restated in ``docs/spider.md``.
"""
