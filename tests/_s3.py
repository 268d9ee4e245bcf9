"""A real S3 API on 127.0.0.1 for the DVC remote tests: moto's server (its S3 backend, in memory, behind werkzeug's
HTTP server) in a thread of the test process; DVC's S3 plugin (dvc-s3, over s3fs and aiobotocore) talks to it as to
AWS, through ``endpointurl``. moto is the one server of S3's API on PyPI that runs in-process without a download
(MinIO, LocalStack and the like fetch a binary or a container image).

``throttle_s`` slows every object the server receives (so a test can kill a ``dvc push`` mid-transfer) and
``objects_put`` counts the objects it has stored whole."""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from typing import Any

import boto3
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

KEY_ID, SECRET = "team-key-id", "team-secret"


class _QuietHandler(MotoRequestHandler):
    def log_request(self, *args: Any) -> None:  # one line per request otherwise, on stderr
        pass


class S3Server:
    """``with S3Server() as s3:``, then ``s3.url(prefix)``, ``s3.remote_options()`` and ``s3.client()``."""

    def __init__(self):
        self.bucket = f"team-{uuid.uuid4().hex[:12]}"  # moto's backend is one per process: a bucket per server
        self.throttle_s = 0.0
        self.objects_put = 0
        self.port = 0
        self._server = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> S3Server:
        moto_app = DomainDispatcherApplication(create_backend_app)
        outer = self

        def app(environ: dict, start_response: Any):
            put = environ["REQUEST_METHOD"] == "PUT" and environ.get("PATH_INFO", "/").count("/") > 1  # an object
            if put and outer.throttle_s:
                time.sleep(outer.throttle_s)
            response = moto_app(environ, start_response)
            if put:
                outer.objects_put += 1
            return response

        self._server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_QuietHandler)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-server", daemon=True)
        self._thread.start()
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def __exit__(self, *exc: object) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=30)
        self._server.shutdown()
        self._thread.join(30)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def remote_options(self) -> dict[str, str]:
        """`dvc remote modify` options a client needs: the endpoint and the team's key (--local: not committed)."""
        return {"endpointurl": self.endpoint, "access_key_id": KEY_ID, "secret_access_key": SECRET}

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                            region_name="us-east-1")
