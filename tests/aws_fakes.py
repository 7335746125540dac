"""Local stand-ins for AWS in tests and the EC2 demo, all on 127.0.0.1.

* `MotoServer`: moto's threaded server (the ``moto[server]`` dev extra) on a
  free loopback port, with boto3 clients pointed at it and fake credentials;
  `live_instances` is what the no-leak checks read.
* `ImdsServer`: an IMDSv2 endpoint (http.server in a thread) serving one
  machine's identity (instance id, local IPv4, type, life cycle) and its
  spot ``instance-action`` notice behind the token protocol.
* `moto_server`: a started `MotoServer` under the fake AWS environment.
* `fixture`: a recorded-shape AWS response from ``tests/fixtures`` (for the
  APIs moto lacks or answers with placeholders), ready for botocore's Stubber.
* Event hooks that inject AWS errors into one operation while everything else
  goes to moto.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

FIXTURES = Path(__file__).parent / "fixtures"
REGION = "us-east-1"

# Fake credentials, no shared config, and no instance-metadata lookups (which
# would leave loopback): what every test that talks to the moto server runs with.
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",  # moto's AMI table makes each region's first call take seconds
}
UNSET_AWS_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
                 "AWS_ENDPOINT_URL", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def fake_aws_env(monkeypatch: Any) -> Iterator[None]:
    for key in UNSET_AWS_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    yield


@contextmanager
def moto_server() -> Iterator["MotoServer"]:
    """A started `MotoServer`, under the fake AWS environment while it runs
    (a test module's fixture: ``with moto_server() as server: yield server``)."""
    import pytest

    with pytest.MonkeyPatch.context() as mp, fake_aws_env(mp):
        server = MotoServer().start()
        try:
            yield server
        finally:
            server.stop()


class MotoServer:
    """moto's threaded server on 127.0.0.1 (started once per test module)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._clients: dict[tuple[str, str], Any] = {}

    def start(self) -> "MotoServer":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def client(self, service: str = "ec2", region: str = REGION) -> Any:
        """A client of the server (one per service and region, kept)."""
        import boto3

        key = (service, region)
        if key not in self._clients:
            self._clients[key] = boto3.session.Session(region_name=region).client(service, endpoint_url=self.url)
        return self._clients[key]

    def live_instances(self, region: str = REGION) -> list[tuple[str, str]]:
        """(id, state) of every instance not terminated or shutting down."""
        reply = self.client("ec2", region).describe_instances(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
        return [(i["InstanceId"], i["State"]["Name"]) for r in reply["Reservations"] for i in r["Instances"]]

    def terminate_all(self, region: str = REGION) -> None:
        """Terminate whatever a failed test left, so the next test starts clean
        (cheaper than moto's reset, after which every backend loads again)."""
        left = [i for i, _ in self.live_instances(region)]
        if left:
            self.client("ec2", region).terminate_instances(InstanceIds=left)


def fixture(name: str) -> dict[str, Any]:
    """A recorded-shape response from tests/fixtures/<name>.json: its
    ``response`` (Price List items re-encoded as the JSON strings AWS sends)
    and ``expected_params``, for `Stubber.add_response`."""
    doc = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    if not doc.get("label", "").startswith("RECORDED-SHAPE"):
        raise ValueError(f"fixture {name} is not labeled")
    response = dict(doc["response"])
    if "PriceList" in response:
        response["PriceList"] = [json.dumps(item) for item in response["PriceList"]]
    for rec in response.get("SpotPriceHistory", []):
        rec["Timestamp"] = datetime.fromisoformat(rec["Timestamp"].replace("Z", "+00:00"))
    return {"response": response, "expected_params": doc.get("expected_params")}


def raise_on(client: Any, operation: str, code: str, message: str = "injected", times: int = 1,
             when: str = "before-call", service: str = "ec2") -> list[int]:
    """Make the next `times` calls of `operation` fail with AWS error `code`
    (``when="after-call"``: after moto has done the work, as a lost answer).
    Returns a one-element list counting the injected failures."""
    from botocore.exceptions import ClientError

    fired = [0]

    def handler(**kwargs: Any) -> None:
        if fired[0] < times:
            fired[0] += 1
            raise ClientError({"Error": {"Code": code, "Message": message}}, operation)

    client.meta.events.register(f"{when}.{service}.{operation}", handler)
    return fired


class ImdsServer:
    """One machine's IMDSv2 metadata service on 127.0.0.1.

    ``PUT /latest/api/token`` needs ``X-aws-ec2-metadata-token-ttl-seconds``
    in 1..21600 and answers a token; every GET needs a live token (401
    otherwise, as an instance that requires IMDSv2 answers). It serves the
    machine's ``instance-id``, ``local-ipv4``, ``instance-type`` and
    ``instance-life-cycle`` (``spot`` or ``on-demand``); the spot
    ``instance-action`` item is 404 until `interrupt` is called.
    """

    def __init__(self, instance_id: str = "i-0123456789abcdef0", *, local_ipv4: str = "127.0.0.1",
                 instance_type: str = "p3.8xlarge", life_cycle: str = "on-demand"):
        self.instance_id = instance_id
        self.items = {"instance-id": instance_id, "local-ipv4": local_ipv4, "instance-type": instance_type,
                      "instance-life-cycle": life_cycle}
        self.notice: dict[str, str] | None = None
        self.tokens: dict[str, float] = {}  # token -> expiry (Unix seconds)
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def start(self) -> "ImdsServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def interrupt(self, action: str = "terminate", in_s: float = 120.0) -> float:
        """Post a spot notice for `in_s` seconds from now (whole seconds, as
        EC2 writes them); returns the notice time."""
        at = int(time.time() + in_s)
        stamp = datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._lock:
            self.notice = {"action": action, "time": stamp}
        return float(at)

    def expire_tokens(self) -> None:
        with self._lock:
            self.tokens = {t: 0.0 for t in self.tokens}

    def statuses(self, path: str) -> list[int]:
        with self._lock:
            return [status for _, p, status in self.requests if p == path]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: str = "") -> None:
                data = body.encode()
                with server._lock:
                    server.requests.append((self.command, self.path, status))
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                if self.path != "/latest/api/token":
                    return self._reply(404)
                try:
                    ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
                except ValueError:
                    return self._reply(400)
                if not 1 <= ttl <= 21600:
                    return self._reply(400)
                token = os.urandom(16).hex()
                with server._lock:
                    server.tokens[token] = time.time() + ttl
                self._reply(200, token)

            def do_GET(self) -> None:
                token = self.headers.get("X-aws-ec2-metadata-token")
                with server._lock:
                    live = token is not None and server.tokens.get(token, 0.0) > time.time()
                    notice = server.notice
                if not live:
                    return self._reply(401)
                item = self.path.removeprefix("/latest/meta-data/")
                if item in server.items:
                    return self._reply(200, server.items[item])
                if self.path == "/latest/meta-data/spot/instance-action" and notice is not None:
                    return self._reply(200, json.dumps(notice))
                self._reply(404)

        return Handler
