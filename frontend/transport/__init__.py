"""The hand-written protocol engines: HTTP/2 and gRPC over it (h2, grpc_native) and
HTTP/1.1 (http1), each serving what the frontend builds over its data plane (the
gRPC handler table, the HTTP app) on a listening socket of sockets.py."""
