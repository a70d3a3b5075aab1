"""Error kinds shared by every process, and how each maps onto HTTP and gRPC."""

import enum


class ErrorCode(enum.IntEnum):
    """Triton's error classes (TRITONSERVER_Error_Code), as carried in messages."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


# Triton's HTTP frontend maps error codes onto statuses this way (HttpCodeFromError in
# its http_server.cc, checked against 2.51 with a python model returning each code):
# the four it names, and 400 for the rest.
HTTP_STATUS = {
    ErrorCode.UNKNOWN: 400,
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
}

# grpc.StatusCode names, so this module need not import grpc.
GRPC_STATUS = {
    ErrorCode.UNKNOWN: "UNKNOWN",
    ErrorCode.INTERNAL: "INTERNAL",
    ErrorCode.NOT_FOUND: "NOT_FOUND",
    ErrorCode.INVALID_ARG: "INVALID_ARGUMENT",
    ErrorCode.UNAVAILABLE: "UNAVAILABLE",
    ErrorCode.UNSUPPORTED: "UNIMPLEMENTED",
    ErrorCode.ALREADY_EXISTS: "ALREADY_EXISTS",
    ErrorCode.CANCELLED: "CANCELLED",
}


class InferError(Exception):
    """An error with a Triton error class; frontends turn it into the protocol's form."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message

    def __repr__(self) -> str:
        return f"InferError({self.code.name}, {self.message!r})"
