"""Spider's gRPC surface (``docs/spider.md``, gRPC surface): the protocol, its stubs, a client.

* ``protos/``: Spider's ``common`` and ``storage`` protocol (the services the coordinator uses);
* ``generated/``: the stubs ``python -m coordinator.spider.grpc.generate`` writes (do not edit);
* ``client.GrpcSpider``: the Spider port over gRPC, for a real Spider cluster.

The server side, any Spider port served as Spider's storage server serves it, is an engine's
business: ``coordinator.engine.grpc_server.serve``.
"""
