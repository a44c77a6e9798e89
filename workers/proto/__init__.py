"""Generated gRPC stubs of workers/proto/pdd.proto (regenerate: python -m workers.proto.compile)."""
