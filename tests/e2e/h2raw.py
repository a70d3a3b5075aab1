"""A raw HTTP/2 client over a socket for the attack and fuzz tests: it writes whatever
frames it is given (transport/h2.py builds them) and, when asked, reads in a thread
what the server answers, frame by frame. And a paced gRPC client that measures how a
second connection is served meanwhile."""

from __future__ import annotations

import socket
import struct
import threading
import time

import hpack
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from frontend.transport import h2

INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"


def request_block(encoder: hpack.Encoder, path: str = INFER, extra=()) -> bytes:
    return encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                           (":authority", "x"), ("content-type", "application/grpc"),
                           ("te", "trailers"), *extra])


def grpc_message(message: bytes) -> bytes:
    return struct.pack(">BI", 0, len(message)) + message


def infer_message(elements: int, model: str = "identity_fp32") -> bytes:
    """A serialized ModelInferRequest: [1, elements] FP32 into `model`."""
    data = np.arange(elements, dtype=np.float32).tobytes()
    req = service_pb2.ModelInferRequest(model_name=model, inputs=[
        service_pb2.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32",
                                                      shape=[1, elements])],
        raw_input_contents=[data])
    return req.SerializeToString()


class RawH2:
    """One client connection that sends raw frames; read() starts a reader thread."""

    def __init__(self, port: int, settings: bytes | None = b"", timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.encoder = hpack.Encoder()
        self.frames: list[tuple[int, int, int, bytes]] = []
        self.ended = threading.Event()  # EOF or reset from the server
        self.reader: threading.Thread | None = None
        if settings is not None:  # None: the caller writes the preface
            self.send(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0, settings))

    def send(self, data: bytes) -> bool:
        """False once the server has gone (or stopped reading for the socket's
        timeout)."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def read(self) -> "RawH2":
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self) -> None:
        buf = b""
        try:
            while True:
                try:
                    data = self.sock.recv(1 << 20)
                except socket.timeout:
                    continue
                if not data:
                    break
                buf += data
                while len(buf) >= 9:
                    n = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + n:
                        break
                    sid = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    self.frames.append((buf[3], buf[4], sid, buf[9:9 + n]))
                    buf = buf[9 + n:]
        except OSError:
            pass
        finally:
            self.ended.set()

    def goaway_code(self) -> int | None:
        for kind, _, _, payload in self.frames:
            if kind == h2.GOAWAY:
                return struct.unpack(">I", payload[4:8])[0]
        return None

    def rst_codes(self) -> dict[int, int]:
        return {sid: struct.unpack(">I", p)[0] for kind, _, sid, p in list(self.frames)
                if kind == h2.RST_STREAM}

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Victim:
    """A second client: a [1,16] ModelInfer to identity_fp32 every 20 ms on its own
    gRPC connection, from start() to stop(); records each call's latency and error."""

    def __init__(self, url: str, pace: float = 0.02):
        self.url = url
        self.pace = pace
        self.done = threading.Event()
        self.latencies: list[float] = []
        self.finished: list[float] = []  # when each call came back (time.monotonic)
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Victim":
        self.thread.start()
        # one call through before the attack starts: the connection is open
        deadline = time.monotonic() + 30
        while not self.latencies and not self.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def _run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
        while not self.done.is_set():
            t0 = time.monotonic()
            try:
                out = client.infer("identity_fp32", [inp], client_timeout=10)
                assert out.as_numpy("OUTPUT0").shape == (1, 16)
                now = time.monotonic()
                self.latencies.append(now - t0)
                self.finished.append(now)
            except Exception as e:  # noqa: BLE001  (recorded, asserted on)
                self.errors.append(repr(e)[:300])
            self.done.wait(self.pace)
        client.close()

    def stop(self) -> "Victim":
        self.done.set()
        self.thread.join(30)
        return self

    def served_throughout(self, start: float, end: float, gap: float = 2.0) -> None:
        """Stopped, no call failed, and between `start` and `end` the victim was never
        left waiting: no stretch longer than `gap` seconds without a call coming back
        (a generous bound, the machine is shared; an attack that stalls the server
        stalls it for seconds). An attack the server ends quickly is judged on its
        short span, not on a count of calls it had no time for."""
        self.stop()
        assert not self.errors, self.errors[:5]
        marks = [start] + [t for t in self.finished if start <= t <= end] + [end]
        gaps = [b - a for a, b in zip(marks, marks[1:])]
        assert max(gaps) < gap, (max(gaps), end - start, len(marks) - 2)
        assert max(self.latencies) < 5.0, max(self.latencies)
