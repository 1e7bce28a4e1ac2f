"""A GET-only admin HTTP port on a daemon thread (``ThreadingHTTPServer``, requests not logged):
the supervisor's and the gateway's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: One answer: (HTTP status, body, ``Content-Type``).
Answer = tuple[int, bytes, str]


class AdminHttpServer:
    """``routes`` (path without query -> thread-safe answerer) on ``host:port`` (0 = a free
    one, see :attr:`port`) by a daemon thread named ``name``; other paths are 404. OSError when
    the address cannot be bound."""

    def __init__(
        self, host: str, port: int, routes: Mapping[str, Callable[[], Answer]], name: str
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                status, body, kind = route() if route else (404, b"not found\n", "text/plain")
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    def start(self) -> None:
        """Serve on the daemon thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
