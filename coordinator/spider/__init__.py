"""Spider: the payload formats Spider accepts (task graph, job inputs, outputs, execution policies).

The Spider port and its engines (embedded, gRPC) build on these.
"""
