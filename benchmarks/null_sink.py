"""A local OTLP/HTTP endpoint that accepts everything and keeps nothing, for the benchmarks.

``python benchmarks/null_sink.py`` listens on 127.0.0.1 (a free port), prints ``port N`` on its
standard output, and answers every ``POST`` to ``/v1/traces``, ``/v1/metrics`` and ``/v1/logs``
with ``200`` and an empty protobuf body (an empty ``Export*ServiceResponse``: nothing rejected),
after reading the request body. It runs in its own process, so its CPU time is not counted in
the process being measured. It stops when its standard input closes, and then prints the
requests and bytes it received per path on its standard output, so the benchmark can tell that
every export arrived.
"""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATHS = ("/v1/traces", "/v1/metrics", "/v1/logs")


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = dict.fromkeys(PATHS, 0)
        self.bytes = dict.fromkeys(PATHS, 0)
        self.rejected = 0


COUNTS = _Counts()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the exporters reuse one connection

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        with COUNTS.lock:
            if path in COUNTS.requests:
                COUNTS.requests[path] += 1
                COUNTS.bytes[path] += len(body)
            else:
                COUNTS.rejected += 1
        status = 200 if path in COUNTS.requests else 404
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    serving = threading.Thread(target=server.serve_forever, name="null-sink", daemon=True)
    serving.start()
    print(f"port {server.server_address[1]}", flush=True)
    sys.stdin.read()  # until the benchmark closes our standard input
    server.shutdown()
    server.server_close()
    with COUNTS.lock:
        for path in PATHS:
            print(f"{path} {COUNTS.requests[path]} {COUNTS.bytes[path]}")
        print(f"rejected {COUNTS.rejected}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
