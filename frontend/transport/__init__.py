"""The protocol engines: the hand-written ones, HTTP/2 and gRPC over it (h2,
grpc_native) and HTTP/1.1 (http1), and the grpc.aio and uvicorn fallbacks
(fallbacks.py). Each serves what the frontend builds over its data plane (the gRPC
handler table, the HTTP app) on a listening socket of sockets.py; engines.py gives
the one a frontend was asked for."""
