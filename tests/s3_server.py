"""moto's standalone S3 server with atomic conditional writes.

    python -m tests.s3_server HOST PORT

moto checks ``If-None-Match: *`` and ``If-Match`` and then stores the object
as two steps on a threaded server, so two racing creates of one key can both
succeed (real S3 lets exactly one win). The table's commits rest on that
create, so writes (PUT, POST, DELETE) go through one lock here; reads stay
concurrent. Everything else is moto's own server, in its own OS process.
"""

import os
import sys
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

_WRITES = frozenset({"PUT", "POST", "DELETE"})


class AtomicWrites:
    """WSGI middleware: one write request at a time, body and all."""

    def __init__(self, app) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") not in _WRITES:
            return self._app(environ, start_response)
        with self._lock:
            return list(self._app(environ, start_response))


def main(argv) -> None:
    host, port = argv[1], int(argv[2])
    os.environ.setdefault("MOTO_PORT", str(port))   # as moto's own main sets it
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, AtomicWrites(app), threaded=True,
               request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv)
