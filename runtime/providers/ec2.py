"""The ``ec2`` provider: EC2 instances through boto3 (issue 7; Srifty 4.5 and
5.4: spot machines, interruptions, re-planning).

One `provision` call:

1. checks the credentials (``sts.get_caller_identity``, once per provider,
   at construction) and reads the price: a failure here starts nothing;
2. makes one ``run_instances`` call with ``MinCount = MaxCount = count``
   (all or nothing), spot through ``InstanceMarketOptions``, every instance
   and volume tagged ``thrifty:run`` (the run id), ``thrifty:launch`` (this
   call) and ``thrifty:market``; the user data is the provider's `user_data`
   (for machines that join a Ray cluster: ``join_script`` of
   `thrifty.runtime.cluster.bootstrap`), else the cluster config's setup
   commands;
3. owns the instances from the moment the call returns and polls
   ``describe_instances`` until all run or `timeout_s` passes;
4. on any failure (a capacity error, the timeout, a lost answer, any other
   exception, Ctrl-C) terminates every instance tagged with this launch (found
   by tag, so also those a lost answer did not name) before the error goes on.

Capacity errors (``InsufficientInstanceCapacity``, the spot capacity and
quota errors in `CAPACITY_ERROR_CODES`) raise `CapacityError`: the runtime
marks that (type, market) depleted and re-plans (Srifty 4.5).

Interruptions: every `poll_interval_s` the driver lists the run's instances
(``describe_instances`` filtered on the run tag); a machine that left
``running`` without the provider terminating it becomes a `Preemption`
(``source="describe"``, no time left). Spot notices from each machine's
metadata service (`ImdsPoller`) become ``source="imds"`` with the two
minutes of warning. Each machine is reported once.

Cost: per-second billing with a 60 s minimum (`billed_cost_usd`) from the
launch time EC2 reports to the termination the provider made or saw, at the
price quoted at launch (the spot price of the machine's zone).

Never leak a machine: `close()` terminates everything the run owns (its own
records and, as a backstop, every live instance carrying the run tag); the
provider is a context manager; while it owns machines, an ``atexit`` hook
and a SIGTERM/SIGHUP handler (raising SystemExit, so ``with`` blocks unwind;
SIGINT already raises KeyboardInterrupt) make it close on every way out.
``thrifty cleanup --run ID`` terminates leftovers of a run that died harder.

moto 5.2 gaps this design avoids: instances are found by the run tag, not
the ``instance-lifecycle`` filter (which moto rejects); machines come from
``run_instances``, not ``create_fleet`` (which moto fails with empty launch
templates); ``describe_instance_types`` is not needed (moto lacks
p3.2xlarge). The Price List API, which moto lacks, is reached through an
injectable client (tests stub it with recorded-shape responses).
"""

from __future__ import annotations

import atexit
import logging
import re
import signal
import threading
import time
import uuid
from calendar import timegm
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from thrifty.core.errors import ProblemError, ProviderError
from thrifty.runtime.events import Preemption
from thrifty.runtime.providers._aws import (
    api_errors,
    error_code,
    error_message,
    is_botocore_error,
    make_client,
    make_session,
    verify_credentials,
)
from thrifty.runtime.providers.base import CapacityError, Machine, MachineState, Market, Provider
from thrifty.runtime.providers.config import ClusterConfig
from thrifty.runtime.providers.config import user_data as setup_user_data
from thrifty.runtime.providers.imds import ImdsPoller
from thrifty.runtime.providers.pricing import PRICING_REGION, ApiPrices, CatalogPrices, Prices

__all__ = ["Ec2Provider", "CAPACITY_ERROR_CODES", "RUN_TAG", "LAUNCH_TAG", "MARKET_TAG", "LIVE_STATES",
           "launch_request", "find_run_instances", "terminate_instance_ids"]

log = logging.getLogger("thrifty.ec2")

RUN_TAG, LAUNCH_TAG, MARKET_TAG = "thrifty:run", "thrifty:launch", "thrifty:market"
MARKETS = ("on_demand", "spot")
LIVE_STATES = ("pending", "running", "stopping", "stopped")
GONE_STATES = ("shutting-down", "terminated", "stopping", "stopped")
# run_instances error codes that mean "no machines of this (type, market) now".
CAPACITY_ERROR_CODES = frozenset({
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacityOnHost",
    "InsufficientSpotInstanceCapacity",
    "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded",
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
})
# State reasons of an instance EC2 ended before it ran: capacity, not a fault.
CAPACITY_STATE_REASONS = frozenset({
    "Server.InsufficientInstanceCapacity",
    "Server.SpotInstanceTermination",
    "Server.SpotInstanceShutdown",
})
_EC2_STATE: dict[str, MachineState] = {
    "pending": "pending", "running": "running", "stopping": "stopping", "stopped": "stopping",
    "shutting-down": "terminated", "terminated": "terminated",
}
# EC2 takes at most 16 KB of user data (before base64)
MAX_USER_DATA_BYTES = 16384
_TRANSITION_TIME = re.compile(r"\((\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) (?:GMT|UTC)\)")


def launch_request(config: ClusterConfig, run_id: str, instance_type: str, count: int, market: str,
                   launch_token: str, user_data: str | None = None) -> dict[str, Any]:
    """The ``run_instances`` arguments of one all-or-nothing launch; the user
    data is `user_data` when given, else the config's setup commands."""
    tags = {"Name": f"thrifty-{run_id}", **config.tags, RUN_TAG: run_id, LAUNCH_TAG: launch_token,
            MARKET_TAG: market}
    tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
    request: dict[str, Any] = {
        "ImageId": config.ami,
        "InstanceType": instance_type,
        "MinCount": count,
        "MaxCount": count,
        "ClientToken": launch_token,
        # A shutdown from inside the machine ends the billing instead of leaving a stopped instance.
        "InstanceInitiatedShutdownBehavior": "terminate",
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tag_list},
                              {"ResourceType": "volume", "Tags": tag_list}],
    }
    if config.subnet:
        request["SubnetId"] = config.subnet
    elif config.availability_zone:
        request["Placement"] = {"AvailabilityZone": config.availability_zone}
    if config.security_groups:
        request["SecurityGroupIds"] = list(config.security_groups)
    if config.key_name:
        request["KeyName"] = config.key_name
    if config.iam_profile_spec:
        request["IamInstanceProfile"] = config.iam_profile_spec
    script = user_data if user_data is not None else setup_user_data(config)
    if script:
        request["UserData"] = script
    if market == "spot":
        options: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if config.spot_max_price_usd is not None:
            options["MaxPrice"] = f"{config.spot_max_price_usd:.6f}"
        request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
    return request


def find_run_instances(ec2: Any, run_id: str, states: Sequence[str] = LIVE_STATES,
                       extra_filters: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Instances tagged with `run_id` in `states` (all states when empty)."""
    filters = [{"Name": f"tag:{RUN_TAG}", "Values": [run_id]}, *extra_filters]
    if states:
        filters.append({"Name": "instance-state-name", "Values": list(states)})
    found: list[dict[str, Any]] = []
    with api_errors(f"describe_instances for run {run_id}"):
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                found.extend(reservation.get("Instances", []))
    return found


def terminate_instance_ids(ec2: Any, ids: Sequence[str]) -> list[dict[str, Any]]:
    """``terminate_instances`` in batches of 500 (the API takes 1000 at most)."""
    changes: list[dict[str, Any]] = []
    for start in range(0, len(ids), 500):
        batch = list(ids[start:start + 500])
        with api_errors(f"terminate_instances {', '.join(batch)}"):
            changes.extend(ec2.terminate_instances(InstanceIds=batch).get("TerminatingInstances", []))
    return changes


def transition_time(reason: str) -> float | None:
    """The time in a StateTransitionReason such as ``User initiated (2026-11-21 11:18:01 GMT)``."""
    m = _TRANSITION_TIME.search(reason or "")
    return float(timegm(tuple(int(g) for g in m.groups()))) if m else None


class _ExitGuard:
    """While armed: `close` runs at interpreter exit, and SIGTERM/SIGHUP raise
    SystemExit in the main thread so ``with`` blocks and ``finally`` run.
    Handlers a program installed itself are left alone."""

    SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s)

    def __init__(self, close: Callable[[], None]):
        self._close = close
        self._previous: dict[int, Any] = {}
        self.armed = False

    def arm(self) -> None:
        if self.armed:
            return
        self.armed = True
        atexit.register(self._close)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.SIGNALS:
            if signal.getsignal(sig) == signal.SIG_DFL:
                self._previous[sig] = signal.signal(sig, self._raise_exit)

    def disarm(self) -> None:
        if not self.armed:
            return
        self.armed = False
        atexit.unregister(self._close)
        if threading.current_thread() is threading.main_thread():
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self._previous.clear()

    @staticmethod
    def _raise_exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)


class Ec2Provider(Provider):
    """Machines from EC2 for one run.

    Clients are injectable (`ec2`, `sts`, `pricing`, or a boto3 `session` and
    an `endpoint_url` for a local EC2-compatible server such as moto); by
    default they come from the standard AWS credential chain with the cluster
    config's retry configuration. `prices` overrides where prices come from.
    `imds_url(machine)`, when given, names a metadata service the driver can
    reach for each machine, and the provider polls it for spot notices (tests
    and the demo; on EC2 the poller runs on the machine, see `imds`).
    `user_data` is every instance's user data (a script such as
    `thrifty.runtime.cluster.bootstrap.join_script`; at most 16 KB), in place
    of the config's setup commands.
    """

    name = "ec2"

    def __init__(self, run_id: str, config: ClusterConfig, *, session: Any = None, endpoint_url: str | None = None,
                 ec2: Any = None, sts: Any = None, pricing: Any = None, prices: Prices | None = None,
                 imds_url: Callable[[Machine], str] | None = None, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, verify: bool = True, user_data: str | None = None):
        if not run_id or len(run_id) > 200:
            raise ProblemError(f"run id '{run_id}' must be 1 to 200 characters")
        if user_data is not None and len(user_data.encode()) > MAX_USER_DATA_BYTES:
            raise ProblemError(f"user data is {len(user_data.encode())} bytes, but EC2 takes at most "
                               f"{MAX_USER_DATA_BYTES}")
        super().__init__(run_id)
        self.config = config
        self.user_data = user_data
        self._clock, self._sleep = clock, sleep
        self._session = session
        self.ec2 = ec2 or self._client("ec2", config.region, endpoint_url)
        self._sts = sts
        self.prices = prices or self._price_book(pricing)
        self._imds_url = imds_url
        self._lock = threading.RLock()
        self._ledger: dict[str, Machine] = {}  # every machine this run started, by instance id
        self._reported: set[str] = set()  # machines a Preemption was emitted for
        self._pollers: dict[str, ImdsPoller] = {}
        self._notices: list[Preemption] = []
        self._last_describe = float("-inf")
        self._guard = _ExitGuard(self.close)
        self.identity: dict[str, str] | None = None
        if verify:
            self.identity = verify_credentials(self._sts or self._client("sts", config.region, endpoint_url))

    # -- clients and prices -------------------------------------------------------
    def _client(self, service: str, region: str, endpoint_url: str | None) -> Any:
        if self._session is None:
            self._session = make_session(region=self.config.region)
        return make_client(self._session, service, region=region, retry_mode=self.config.retries.mode,
                           max_attempts=self.config.retries.max_attempts, endpoint_url=endpoint_url)

    def _price_book(self, pricing: Any) -> Prices:
        if self.config.prices == "catalog":
            from thrifty.datasets.catalog import load_catalog

            return CatalogPrices(load_catalog(self.config.catalog))
        # The Price List API lives in PRICING_REGION, whatever the run's region.
        return ApiPrices(self.config.region, self.ec2, pricing or self._client("pricing", PRICING_REGION, None))

    def price(self, instance_type: str, market: str = "on_demand") -> float:
        _check_market(market)
        return self.prices.price(instance_type, market, self.config.availability_zone)

    # -- provisioning ---------------------------------------------------------------
    def provision(self, instance_type: str, count: int, market: Market = "on_demand",
                  timeout_s: float | None = None) -> list[Machine]:
        _check_market(market)
        if count < 1:
            raise ProblemError(f"count is {count}, but must be at least 1")
        timeout_s = self.config.launch_timeout_s if timeout_s is None else timeout_s
        quoted = self.price(instance_type, market)  # a price that cannot be read stops the launch before it costs
        self._guard.arm()
        launch = f"thrifty-{uuid.uuid4().hex}"
        request = launch_request(self.config, self.run_id, instance_type, count, market, launch, self.user_data)
        what = f"{count} {instance_type} ({market.replace('_', '-')})"
        started: list[Machine] = []
        try:
            reply = self.ec2.run_instances(**request)
            started = [self._record(i, market, quoted) for i in reply.get("Instances", [])]
            log.info("run %s: launched %s: %s", self.run_id, what, ", ".join(m.id for m in started))
            machines = self._wait_running(started, market, timeout_s, what)
        except BaseException as e:
            self._reap_launch(launch, [m.id for m in started], quoted)
            code = error_code(e)
            if code in CAPACITY_ERROR_CODES:
                raise CapacityError(instance_type, market,
                                    f"no capacity for {what}: {code}: {error_message(e)}") from None
            if is_botocore_error(e):
                raise ProviderError(f"launching {what} failed: {e}") from e
            raise
        return machines

    def _record(self, instance: dict[str, Any], market: Market, price: float) -> Machine:
        """Own `instance` (a describe_instances record) and return it as a Machine."""
        with self._lock:
            machine = Machine(
                id=instance["InstanceId"],
                instance_type=instance["InstanceType"],
                market=market,
                host=self._host(instance),
                launched_at=instance["LaunchTime"].timestamp(),
                price_per_hour=price,
                state=_EC2_STATE.get(instance["State"]["Name"], "pending"),
                tags={t["Key"]: t["Value"] for t in instance.get("Tags", [])},
            )
            self._ledger[machine.id] = machine
            return machine

    def _host(self, instance: dict[str, Any]) -> str:
        if self.config.use_public_ip and instance.get("PublicIpAddress"):
            return instance["PublicIpAddress"]
        return instance.get("PrivateIpAddress") or instance.get("PublicIpAddress") or ""

    def _wait_running(self, started: list[Machine], market: Market, timeout_s: float, what: str) -> list[Machine]:
        ids = [m.id for m in started]
        deadline = time.monotonic() + timeout_s
        while True:
            seen = self._describe_ids(ids)
            for instance in seen.values():
                if instance["State"]["Name"] in GONE_STATES:
                    reason = instance.get("StateReason", {})
                    text = f"{instance['InstanceId']} went to {instance['State']['Name']} while starting " \
                           f"({reason.get('Code', '?')}: {reason.get('Message', '')})"
                    if reason.get("Code") in CAPACITY_STATE_REASONS:
                        raise CapacityError(instance["InstanceType"], market, f"no capacity for {what}: {text}")
                    raise ProviderError(f"launching {what} failed: {text}")
            if len(seen) == len(ids) and all(i["State"]["Name"] == "running" for i in seen.values()):
                return [self._running(seen[i], market) for i in ids]
            left = deadline - time.monotonic()
            if left <= 0:
                running = sum(i["State"]["Name"] == "running" for i in seen.values())
                raise ProviderError(f"launching {what} timed out: {running} of {len(ids)} running after "
                                    f"{timeout_s:g} s; all of them are terminated")
            self._sleep(min(self.config.poll_interval_s, left))

    def _running(self, instance: dict[str, Any], market: Market) -> Machine:
        zone = instance.get("Placement", {}).get("AvailabilityZone")
        price = self.prices.price(instance["InstanceType"], market, zone)
        machine = self._record(instance, market, price)
        if self._imds_url is not None:
            poller = ImdsPoller(machine.instance_type, market, machine.id, base_url=self._imds_url(machine),
                                interval_s=self.config.imds_interval_s)
            self._pollers[machine.id] = poller.start(self._on_notice)
        return machine

    def _describe_ids(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Instances by id; ids EC2 does not know yet (eventual consistency) are absent."""
        from botocore.exceptions import ClientError

        try:
            reply = self.ec2.describe_instances(InstanceIds=list(ids))
        except ClientError as e:
            if error_code(e) == "InvalidInstanceID.NotFound":
                return {}
            raise
        return {i["InstanceId"]: i for r in reply.get("Reservations", []) for i in r.get("Instances", [])}

    def _reap_launch(self, launch: str, known: Sequence[str], price: float) -> None:
        """Terminate every instance of one failed launch: those named, and those
        carrying its tag (a launch whose answer was lost)."""
        ids = sorted(known)
        try:
            # The named ones first: this needs no describe call, which may be what just failed.
            self._terminate_ids(ids)
            tagged = find_run_instances(self.ec2, self.run_id, LIVE_STATES,
                                        [{"Name": f"tag:{LAUNCH_TAG}", "Values": [launch]}])
            for instance in tagged:
                if instance["InstanceId"] not in self._ledger:
                    self._record(instance, instance_market(instance), price)
            ids = sorted({i["InstanceId"] for i in tagged} - set(ids))
            self._terminate_ids(ids)
        except BaseException as e:  # never hide the launch's own error behind this one
            log.error("run %s: could not terminate the failed launch's instances %s (%r); run: thrifty cleanup "
                      "--run %s --region %s", self.run_id, ids, e, self.run_id, self.config.region)

    # -- terminating ------------------------------------------------------------------
    def terminate(self, machines: Iterable[Machine]) -> list[Machine]:
        ids = [m.id for m in machines]
        with self._lock:
            unknown = [i for i in ids if i not in self._ledger]
            if unknown:
                raise ProblemError(f"machines {', '.join(unknown)} do not belong to run {self.run_id}")
            self._terminate_ids([i for i in ids if self._ledger[i].terminated_at is None])
            return [self._ledger[i] for i in ids]

    def _terminate_ids(self, ids: Sequence[str]) -> None:
        if not ids:
            return
        terminate_instance_ids(self.ec2, ids)
        now = self._clock()
        with self._lock:
            for i in ids:
                self._end(i, now)
        log.info("run %s: terminated %s", self.run_id, ", ".join(ids))

    def _end(self, instance_id: str, at: float) -> None:
        machine = self._ledger.get(instance_id)
        if machine is not None and machine.terminated_at is None:
            self._ledger[instance_id] = machine.ended(max(at, machine.launched_at))
        poller = self._pollers.pop(instance_id, None)
        if poller is not None:
            poller.stop(timeout_s=0.0)

    def machines(self) -> list[Machine]:
        with self._lock:
            return [m for m in self._ledger.values() if m.terminated_at is None]

    def all_machines(self) -> list[Machine]:
        """Every machine this run started, terminated ones included (billing)."""
        with self._lock:
            return list(self._ledger.values())

    def close(self) -> None:
        """Terminate everything this run owns: the machines on record, and any
        live instance carrying the run tag (a backstop for lost answers)."""
        try:
            ids = {m.id for m in self.machines()}
            try:
                ids.update(i["InstanceId"] for i in find_run_instances(self.ec2, self.run_id))
            finally:
                self._terminate_ids(sorted(ids))
        finally:
            for poller in list(self._pollers.values()):
                poller.stop(timeout_s=0.0)
            self._pollers.clear()
            self._guard.disarm()

    # -- interruptions -----------------------------------------------------------------
    def _on_notice(self, event: Preemption) -> None:
        with self._lock:
            self._notices.append(event)

    def poll_interruptions(self) -> list[Preemption]:
        """Spot notices from the machines' metadata services, and (at most every
        `poll_interval_s`) machines that left ``running`` in describe_instances."""
        with self._lock:
            events, self._notices = self._notices, []
        if time.monotonic() - self._last_describe >= self.config.poll_interval_s:
            self._last_describe = time.monotonic()
            events.extend(self._state_changes())
        with self._lock:
            fresh = [e for e in events if e.machine_id not in self._reported]
            self._reported.update(e.machine_id for e in fresh if e.machine_id)
        return _once_per_machine(fresh)

    def _state_changes(self) -> list[Preemption]:
        live = {m.id: m for m in self.machines()}
        if not live:
            return []
        events = []
        stopped = []
        for instance in find_run_instances(self.ec2, self.run_id, states=()):
            machine = live.get(instance["InstanceId"])
            state = instance["State"]["Name"]
            if machine is None or state not in GONE_STATES:
                continue
            at = transition_time(instance.get("StateTransitionReason", "")) or self._clock()
            with self._lock:
                self._end(machine.id, at)
            if state in ("stopping", "stopped"):
                stopped.append(machine.id)  # a stopped machine still holds its volume: give it back
            reason = instance.get("StateReason", {}).get("Message") or f"instance is {state}"
            events.append(Preemption(machine.instance_type, machine.market, source="describe",
                                     machine_id=machine.id, time_left_s=0.0, reason=reason, at=at))
        if stopped:
            self._terminate_ids(stopped)
        return events

    # -- cost ---------------------------------------------------------------------------
    def cost_usd(self, now: float | None = None) -> float:
        """What the run's machines cost so far (per second, 60 s minimum each)."""
        now = self._clock() if now is None else now
        with self._lock:
            return sum(m.cost_usd(now) for m in self._ledger.values())

    def billing(self, now: float | None = None) -> list[dict[str, Any]]:
        """One record per machine for the run log: launch, end, price, billed seconds, cost."""
        now = self._clock() if now is None else now
        with self._lock:
            machines = sorted(self._ledger.values(), key=lambda m: (m.launched_at, m.id))
        return [{
            "machine_id": m.id, "instance_type": m.instance_type, "market": m.market,
            "launched_at": m.launched_at, "terminated_at": m.terminated_at,
            "price_per_hour": m.price_per_hour,
            "billed_s": max((m.terminated_at or now) - m.launched_at, 60.0),
            "cost_usd": m.cost_usd(now),
        } for m in machines]


def instance_market(instance: dict[str, Any]) -> Market:
    """``spot`` or ``on_demand``, from the instance's own record."""
    return "spot" if instance.get("InstanceLifecycle") == "spot" else "on_demand"


def _check_market(market: str) -> None:
    if market not in MARKETS:
        raise ProblemError(f"market is '{market}', but must be 'on_demand' or 'spot'")


def _once_per_machine(events: list[Preemption]) -> list[Preemption]:
    seen: set[str] = set()
    out = []
    for e in events:
        if e.machine_id is None or e.machine_id not in seen:
            out.append(e)
            if e.machine_id:
                seen.add(e.machine_id)
    return out
