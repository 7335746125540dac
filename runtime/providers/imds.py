"""Spot interruption notices from the EC2 instance metadata service, IMDSv2
(issue 7; Srifty 4.5: a preempted type is depleted and the job re-planned).

Two minutes before EC2 reclaims a spot instance, the metadata item
``/latest/meta-data/spot/instance-action`` appears on that instance with
``{"action": "terminate" | "stop" | "hibernate", "time": "2026-11-21T08:22:00Z"}``;
until then the item answers 404. IMDSv2 needs a session token:
``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``, then
every GET carries ``X-aws-ec2-metadata-token``; a 401 means the token
expired, and a new one is fetched.

`ImdsClient` holds that token protocol (one token until a minute before it
expires, one fresh token and one retry on a 401) and reads any metadata
item: the machine's identity (`instance_identity`: instance id, private
IPv4, instance type, market) for ``thrifty node join``, and the notice.
The service's address is ``$THRIFTY_IMDS_URL`` when set (a test stands in
a local server; ``thrifty node join`` exports it to the processes of its
Ray node), else http://169.254.169.254 (`imds_url`).

`ImdsPoller.check` makes one round and turns a notice into the runtime's
`Preemption` (``source="imds"``, `time_left_s` = notice time - now);
`ImdsPoller.start` polls every `interval_s` seconds in a thread and delivers
the notice once. The metadata service answers only the instance that asks
(169.254.169.254 is link-local), so on EC2 the poller runs on each machine:
``python -m thrifty.runtime.providers.imds --instance-type T --market spot``
prints the notice as one JSON line and exits, for the machine's worker to
forward. In tests and the demo a local IMDSv2 server stands in for it and the
driver's `Ec2Provider` polls it directly.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from thrifty.core.errors import ProviderError
from thrifty.core.validation import json_object
from thrifty.runtime.events import Preemption

__all__ = ["ImdsClient", "ImdsPoller", "InstanceAction", "InstanceIdentity", "parse_instance_action",
           "instance_identity", "imds_url", "DEFAULT_IMDS_URL", "IMDS_URL_ENV", "ACTION_PATH", "TOKEN_PATH",
           "TOKEN_HEADER", "TOKEN_TTL_HEADER", "INSTANCE_ID_PATH", "LOCAL_IPV4_PATH", "INSTANCE_TYPE_PATH",
           "LIFE_CYCLE_PATH"]

DEFAULT_IMDS_URL = "http://169.254.169.254"
IMDS_URL_ENV = "THRIFTY_IMDS_URL"
TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
LOCAL_IPV4_PATH = "/latest/meta-data/local-ipv4"
INSTANCE_TYPE_PATH = "/latest/meta-data/instance-type"
# "spot", "on-demand", "scheduled" or "capacity-block": how the instance was bought
LIFE_CYCLE_PATH = "/latest/meta-data/instance-life-cycle"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
ACTIONS = ("terminate", "stop", "hibernate")


@dataclass(frozen=True)
class InstanceAction:
    """A spot interruption notice: what EC2 will do, and when (Unix seconds)."""

    action: str
    at: float


def parse_instance_action(body: str) -> InstanceAction:
    """Parse the ``spot/instance-action`` document; ValueError if malformed."""
    try:
        doc = json.loads(body)
        action, stamp = doc["action"], doc["time"]
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"malformed spot instance-action document {body[:80]!r}") from e
    if action not in ACTIONS:
        raise ValueError(f"spot instance-action is '{action}', but must be one of {', '.join(ACTIONS)}")
    at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    if at.tzinfo is None:
        raise ValueError(f"spot instance-action time '{stamp}' has no time zone")
    return InstanceAction(action=action, at=at.timestamp())


def imds_url() -> str:
    """The metadata service's address: ``$THRIFTY_IMDS_URL``, else EC2's link-local one."""
    return os.environ.get(IMDS_URL_ENV) or DEFAULT_IMDS_URL


class ImdsClient:
    """One IMDSv2 session: a token from ``PUT /latest/api/token``, renewed a
    minute before it expires, carried by every GET; a 401 (the token expired
    or was revoked) gets one fresh token and one retry. `base_url` defaults
    to `imds_url()`. Network errors (`urllib.error.URLError`, `OSError`)
    reach the caller."""

    def __init__(self, base_url: str | None = None, *, timeout_s: float = 1.0, token_ttl_s: int = 21600,
                 clock: Callable[[], float] = time.time):
        self.base_url = (base_url or imds_url()).rstrip("/")
        self.timeout_s, self.token_ttl_s = timeout_s, int(token_ttl_s)
        self.clock = clock
        self._token: str | None = None
        self._token_expires = 0.0
        # Loopback and link-local addresses must never go through an HTTP proxy.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(self, path: str) -> tuple[int, str]:
        """``(HTTP status, body)`` of one metadata item."""
        status, body = self._get(path)
        if status == 401:  # the token expired or was revoked: one fresh token, one retry
            self._token = None
            status, body = self._get(path)
        return status, body

    def item(self, path: str) -> str:
        """The text of a metadata item that must exist; `ProviderError` when
        the service cannot be reached or does not have it."""
        try:
            status, body = self.get(path)
        except (urllib.error.URLError, OSError) as e:
            raise ProviderError(f"cannot reach the metadata service at {self.base_url}: {e}") from e
        if status != 200:
            raise ProviderError(f"the metadata service at {self.base_url} answered HTTP {status} for {path}")
        return body.strip()

    def _token_now(self) -> str:
        if self._token is None or self.clock() >= self._token_expires:
            request = urllib.request.Request(self.base_url + TOKEN_PATH, method="PUT", data=b"",
                                             headers={TOKEN_TTL_HEADER: str(self.token_ttl_s)})
            with self._opener.open(request, timeout=self.timeout_s) as reply:
                self._token = reply.read().decode("ascii").strip()
            # Renew a minute early so that a token never expires between two rounds.
            self._token_expires = self.clock() + max(1.0, self.token_ttl_s - 60.0)
        return self._token

    def _get(self, path: str) -> tuple[int, str]:
        request = urllib.request.Request(self.base_url + path, headers={TOKEN_HEADER: self._token_now()})
        try:
            with self._opener.open(request, timeout=self.timeout_s) as reply:
                return reply.status, reply.read().decode("utf-8")
        except urllib.error.HTTPError as e:
            e.close()
            return e.code, ""


@dataclass(frozen=True)
class InstanceIdentity:
    """What a machine's metadata service says it is."""

    instance_id: str
    local_ipv4: str
    instance_type: str
    market: str  # "spot" or "on_demand", thrifty's market names


def instance_identity(client: ImdsClient) -> InstanceIdentity:
    """This machine's identity from its metadata service (`ProviderError`
    when an item cannot be read)."""
    life_cycle = client.item(LIFE_CYCLE_PATH)
    return InstanceIdentity(instance_id=client.item(INSTANCE_ID_PATH), local_ipv4=client.item(LOCAL_IPV4_PATH),
                            instance_type=client.item(INSTANCE_TYPE_PATH),
                            market="spot" if life_cycle == "spot" else "on_demand")


class ImdsPoller:
    """Poll one machine's metadata service for a spot interruption notice.

    `instance_type`, `market` and `machine_id` label the `Preemption` it
    produces. Errors reaching the service are counted in `failures` (last one
    in `last_error`) and retried at the next round: the metadata service is
    local to the machine, and a missed round only delays the notice.
    `base_url` defaults to `imds_url()` (``$THRIFTY_IMDS_URL``, which a
    process on a Ray node that ``thrifty node join`` started inherits).
    """

    def __init__(self, instance_type: str, market: str = "spot", machine_id: str | None = None, *,
                 base_url: str | None = None, interval_s: float = 5.0, timeout_s: float = 1.0,
                 token_ttl_s: int = 21600, clock: Callable[[], float] = time.time):
        if interval_s <= 0:
            raise ValueError(f"interval_s is {interval_s}, but must be positive")
        self.instance_type, self.market, self.machine_id = instance_type, market, machine_id
        self.client = ImdsClient(base_url, timeout_s=timeout_s, token_ttl_s=token_ttl_s, clock=clock)
        self.base_url = self.client.base_url
        self.interval_s = interval_s
        self.clock = clock
        self.failures = 0
        self.last_error: str | None = None
        self._events: queue.Queue[Preemption] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one round ------------------------------------------------------------------
    def check(self) -> Preemption | None:
        """One round: the notice as a `Preemption`, or None (no notice, or the
        service could not be reached: see `last_error`)."""
        try:
            status, body = self.client.get(ACTION_PATH)
        except (urllib.error.URLError, OSError) as e:
            self._failed(f"cannot reach the metadata service at {self.base_url}: {e}")
            return None
        if status == 404:
            self.last_error = None
            return None
        if status != 200:
            self._failed(f"{ACTION_PATH} answered HTTP {status}")
            return None
        try:
            notice = parse_instance_action(body)
        except ValueError as e:
            self._failed(str(e))
            return None
        self.last_error = None
        return Preemption(self.instance_type, self.market, source="imds", machine_id=self.machine_id,
                          time_left_s=max(0.0, notice.at - self.clock()),
                          reason=f"spot instance-action '{notice.action}' at "
                                 f"{datetime.fromtimestamp(notice.at).astimezone().isoformat()}")

    def _failed(self, message: str) -> None:
        self.failures += 1
        self.last_error = message

    # -- in a thread ----------------------------------------------------------------
    def start(self, on_notice: Callable[[Preemption], None] | None = None) -> "ImdsPoller":
        """Poll every `interval_s` in a daemon thread until a notice arrives
        (it is final: delivered once, to `on_notice` or to `events()`) or
        `stop()` is called."""
        if self._thread is not None:
            raise RuntimeError("this poller is already started")
        deliver = on_notice or self._events.put

        def loop() -> None:
            while not self._stop.is_set():
                event = self.check()
                if event is not None:
                    deliver(event)
                    return
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, name=f"imds-{self.machine_id or self.base_url}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def events(self, wait_s: float = 0.0) -> list[Preemption]:
        """Notices delivered since the last call (when started without a
        callback); with `wait_s`, waits up to that long for the first one."""
        out = []
        if wait_s > 0:
            try:
                out.append(self._events.get(timeout=wait_s))
            except queue.Empty:
                return out
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out


def main(argv: list[str] | None = None) -> int:
    """On an EC2 machine: wait for this machine's spot notice, print it as
    one JSON line, exit 0 (or exit 1 after `--max-wait` seconds without one)."""
    ap = argparse.ArgumentParser(prog="python -m thrifty.runtime.providers.imds", description=main.__doc__)
    ap.add_argument("--instance-type", required=True)
    ap.add_argument("--market", default="spot", choices=("spot", "on_demand"))
    ap.add_argument("--url", default=imds_url(), help=f"metadata service (default ${IMDS_URL_ENV}, else "
                                                       f"{DEFAULT_IMDS_URL}; now %(default)s)")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between rounds (default 5)")
    ap.add_argument("--max-wait", type=float, default=None, help="give up after this many seconds")
    args = ap.parse_args(argv)
    poller = ImdsPoller(args.instance_type, args.market, base_url=args.url, interval_s=args.interval)
    poller.machine_id = _instance_id(poller)
    deadline = None if args.max_wait is None else time.monotonic() + args.max_wait
    while deadline is None or time.monotonic() < deadline:
        event = poller.check()
        if event is not None:
            print(json.dumps(json_object(event)), flush=True)
            return 0
        time.sleep(args.interval)
    return 1


def _instance_id(poller: ImdsPoller) -> str | None:
    try:
        return poller.client.item(INSTANCE_ID_PATH)
    except ProviderError:
        return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
