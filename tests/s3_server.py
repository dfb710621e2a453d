"""A real S3 API server (moto's) on 127.0.0.1 for the shard tests, recording the object reads it answers."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any


class LoopbackS3:
    """moto's S3 WSGI application served by werkzeug on a free loopback port, in a thread of the test process.

    ``reads`` records ``(object path, Range header)`` of every GET, so a test sees what a run read from storage.
    ``env`` holds the dummy credentials a client (a training subprocess) needs; ``storage_options`` the fsspec
    options that point s3fs at this server.
    """

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        app = DomainDispatcherApplication(create_backend_app)
        self.reads: list[tuple[str, str | None]] = []
        self._lock = threading.Lock()

        def recording(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if environ.get("REQUEST_METHOD") == "GET":
                with self._lock:
                    self.reads.append((environ.get("PATH_INFO", ""), environ.get("HTTP_RANGE")))
            return app(environ, start_response)

        self._server = make_server("127.0.0.1", 0, recording, threaded=True, request_handler=Quiet)
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}
        self.storage_options = {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}

    def make_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=name)

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)
