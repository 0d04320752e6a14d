"""Spider's gRPC surface (``spider-contract.md`` §7): the protocol, its stubs, a client, a server.

* ``protos/``: Spider's ``common`` and ``storage`` protocol (the services the coordinator uses);
* ``generated/``: the stubs ``python -m coordinator.spider.grpc.generate`` writes (do not edit);
* ``client.GrpcSpider``: the Spider port over gRPC, for a real Spider cluster;
* ``server.serve``: any Spider port (the embedded engine) served as Spider's storage server does.
"""
