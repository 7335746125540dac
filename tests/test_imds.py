"""The IMDSv2 spot-notice poller against a local IMDSv2 server on 127.0.0.1
(issue 7): token protocol, notice -> Preemption with the time left, token
expiry, an unreachable service, the polling thread and the on-machine CLI."""

from __future__ import annotations

import json
import time

import pytest

from aws_fakes import ImdsServer, free_port
from thrifty.runtime.providers.imds import ACTION_PATH, TOKEN_PATH, ImdsPoller, main, parse_instance_action


@pytest.fixture
def imds():
    server = ImdsServer("i-0a1b2c3d4e5f60718").start()
    try:
        yield server
    finally:
        server.close()


def poller(server: ImdsServer, **kw) -> ImdsPoller:
    return ImdsPoller("p3.8xlarge", "spot", "i-0a1b2c3d4e5f60718", base_url=server.url, interval_s=0.05, **kw)


def test_parse_instance_action():
    notice = parse_instance_action('{"action": "stop", "time": "2026-11-21T08:22:00Z"}')
    assert notice.action == "stop" and notice.at == 1795249320.0
    for bad in ('{"action": "reboot", "time": "2026-11-21T08:22:00Z"}', '{"action": "terminate"}', "<html>",
                '{"action": "terminate", "time": "2026-11-21T08:22:00"}'):
        with pytest.raises(ValueError):
            parse_instance_action(bad)


def test_no_notice_then_a_notice_with_two_minutes_left(imds):
    p = poller(imds)
    assert p.check() is None and p.last_error is None
    assert imds.statuses(TOKEN_PATH) == [200] and imds.statuses(ACTION_PATH) == [404]  # the GET carried the token
    at = imds.interrupt("terminate", in_s=120)
    event = p.check()
    assert (event.source, event.instance_type, event.market, event.machine_id) == (
        "imds", "p3.8xlarge", "spot", "i-0a1b2c3d4e5f60718")
    assert event.time_left_s == pytest.approx(at - time.time(), abs=1.0) and 118 < event.time_left_s <= 120
    assert "'terminate'" in event.reason
    assert imds.statuses(TOKEN_PATH) == [200]  # one token serves every round until it expires


def test_an_expired_token_is_replaced(imds):
    p = poller(imds)
    p.check()
    imds.expire_tokens()
    imds.interrupt("hibernate", in_s=60)
    event = p.check()
    assert event is not None and "'hibernate'" in event.reason
    assert imds.statuses(ACTION_PATH) == [404, 401, 200] and imds.statuses(TOKEN_PATH) == [200, 200]


def test_a_token_is_renewed_before_it_expires(imds):
    now = [1000.0]
    p = poller(imds, token_ttl_s=120, clock=lambda: now[0])
    p.check()
    now[0] += 59  # renewed a minute early: ttl 120 -> after 60 s
    p.check()
    now[0] += 2
    p.check()
    assert imds.statuses(TOKEN_PATH) == [200, 200] and imds.statuses(ACTION_PATH) == [404, 404, 404]


def test_unreachable_or_garbled_service_is_counted_not_raised(imds):
    gone = ImdsPoller("g4dn.xlarge", base_url=f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    assert gone.check() is None and gone.failures == 1 and "cannot reach" in gone.last_error
    p = poller(imds)
    imds.notice = {"action": "explode", "time": "soon"}
    assert p.check() is None and p.failures == 1 and "instance-action" in p.last_error


def test_the_thread_delivers_the_notice_once_and_stops(imds):
    p = poller(imds).start()
    try:
        time.sleep(0.15)
        assert p.events() == [] and p.running
        imds.interrupt(in_s=120)
        deadline = time.monotonic() + 5
        events = []
        while not events and time.monotonic() < deadline:
            events = p.events()
            time.sleep(0.02)
        assert [e.machine_id for e in events] == ["i-0a1b2c3d4e5f60718"]
        deadline = time.monotonic() + 5
        while p.running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not p.running and p.events() == []  # a notice is final: delivered once, polling over
    finally:
        p.stop()


def test_on_machine_command_prints_the_notice(imds, capsys):
    assert main(["--instance-type", "p3.8xlarge", "--url", imds.url, "--interval", "0.05", "--max-wait", "0.2"]) == 1
    imds.interrupt("terminate", in_s=120)
    assert main(["--instance-type", "p3.8xlarge", "--url", imds.url, "--interval", "0.05", "--max-wait", "5"]) == 0
    event = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert event["source"] == "imds" and event["machine_id"] == "i-0a1b2c3d4e5f60718" and event["time_left_s"] > 100
