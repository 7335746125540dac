"""The ec2 provider against a real moto server on 127.0.0.1 (issue 7).

Every test ends with a check of the moto server that no instance is left
pending, running or stopped. The Price List API (which moto lacks), real spot
price history (moto answers placeholders) and a real spot reclaim record come
from labeled recorded-shape fixtures in tests/fixtures through botocore's
Stubber or an event hook; capacity errors and throttling are injected with
event hooks while everything else goes to moto.
"""

from __future__ import annotations

import base64
import io
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from calendar import timegm
from datetime import date, datetime, timezone

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.stub import ANY, Stubber

from aws_fakes import REGION, ImdsServer, fixture, moto_server, raise_on
from helpers import TERMINAL
from thrifty.datasets.catalog import DEFAULT_CATALOG, load_catalog, parse_catalog
from thrifty.core.io import read_json, write_json
from thrifty.core.errors import ProblemError, ProviderError
from thrifty.runtime.cli import main
from thrifty.runtime.providers.base import CapacityError
from thrifty.runtime.providers.config import load_cluster_config, parse_cluster_config, user_data
from thrifty.runtime.providers.ec2 import (
    CAPACITY_ERROR_CODES,
    LAUNCH_TAG,
    MARKET_TAG,
    RUN_TAG,
    Ec2Provider,
    launch_request,
)
from thrifty.runtime.providers.pricing import ApiPrices, refresh_catalog

AMI = "ami-0123456789abcdef0"


@pytest.fixture(scope="module")
def moto():
    with moto_server() as server:
        yield server


@pytest.fixture(autouse=True)
def no_machine_left(moto):
    yield
    left = moto.live_instances()
    moto.terminate_all()
    assert not left, f"instances left running after the test: {left}"


@pytest.fixture
def pricing():
    """A Price List client whose answers come from the recorded-shape fixtures."""
    client = boto3.session.Session(region_name=REGION).client("pricing")
    with Stubber(client) as stubber:
        yield client, stubber


def stub_on_demand(stubber: Stubber, instance_type: str) -> None:
    f = fixture(f"pricing_get_products_{instance_type.replace('.', '_')}")
    stubber.add_response("get_products", f["response"], f["expected_params"])


def config(**fields):
    return parse_cluster_config({"region": REGION, "ami": AMI, "poll_interval_s": 0.02, "launch_timeout_s": 5,
                                 "imds_interval_s": 0.05, **fields})


def provider(moto, pricing_client=None, run_id="run-1", **fields) -> Ec2Provider:
    return Ec2Provider(run_id, config(**fields), endpoint_url=moto.url, pricing=pricing_client)


def described(moto, instance_id):
    reply = moto.client().describe_instances(InstanceIds=[instance_id])
    return reply["Reservations"][0]["Instances"][0]


# -- cluster config -----------------------------------------------------------------------

def test_config_yaml_and_json_give_the_same_config(tmp_path):
    (tmp_path / "c.yaml").write_text(textwrap.dedent(f"""\
        region: {REGION}
        ami: {AMI}
        subnet: subnet-0abc1234
        security_groups: [sg-0abc1234]
        key_name: thrifty
        iam_instance_profile: thrifty-worker
        setup_commands:
          - pip install 'thrifty[torch]'
          - echo ready
        """))
    (tmp_path / "c.json").write_text(
        f'{{"region": "{REGION}", "ami": "{AMI}", "subnet": "subnet-0abc1234", "security_groups": ["sg-0abc1234"],'
        ' "key_name": "thrifty", "iam_instance_profile": "thrifty-worker",'
        ' "setup_commands": ["pip install \'thrifty[torch]\'", "echo ready"]}')
    from_yaml, from_json = load_cluster_config(tmp_path / "c.yaml"), load_cluster_config(tmp_path / "c.json")
    assert from_yaml == from_json
    assert from_yaml.iam_profile_spec == {"Name": "thrifty-worker"}
    assert user_data(from_yaml) == "#!/bin/bash\nset -euxo pipefail\npip install 'thrifty[torch]'\necho ready\n"


@pytest.mark.parametrize("fields, path, words", [
    ({"security_groups": ["sg-0abc1234", "default"]}, "security_groups[1]", "should match pattern"),
    ({"retries": {"mode": "fast"}}, "retries.mode", "'standard', 'adaptive' or 'legacy'"),
    ({"subnet_id": "subnet-0abc1234"}, "subnet_id", "is not a known field"),
    ({"tags": {"thrifty:run": "x"}}, "tags", "reserved"),
    ({"launch_timeout_s": 0}, "launch_timeout_s", "greater than 0"),
    ({"install": "latest"}, "install", "must be 'version', 'none', or a wheel"),
    ({"install": "thrifty-0.1.0.whl"}, "install", "an absolute path"),
    ({"install": "s3://bucket/thrifty-0.1.0-py3-none-any.whl"}, "install", "http(s) or file URL"),
    ({"head_address": "10.0.0.5"}, "head_address", "must be HOST:PORT"),
    ({"ray_port": 70000}, "ray_port", "must be at most 65,535"),
    ({"join_timeout_s": 0}, "join_timeout_s", "must be greater than 0"),
])
def test_config_errors_name_the_field(fields, path, words):
    with pytest.raises(ProblemError) as info:
        config(**fields)
    assert info.value.path == path
    assert words in str(info.value)


def test_config_ray_cluster_defaults():
    c = config()
    assert (c.install, c.head_address, c.ray_port, c.join_timeout_s) == ("version", None, 6379, 600.0)
    assert config(install="none", head_address="10.0.0.5:6380").head_address == "10.0.0.5:6380"


def test_config_missing_region_and_bad_yaml(tmp_path):
    with pytest.raises(ProblemError) as info:
        parse_cluster_config({"ami": AMI})
    assert info.value.path == "region" and "required" in str(info.value)
    (tmp_path / "bad.yaml").write_text("region: us-east-1\nami: [unclosed\n")
    with pytest.raises(ProblemError, match=r"bad.yaml: not valid YAML.*line 3"):
        load_cluster_config(tmp_path / "bad.yaml")


def test_launch_request_for_spot_names_the_market_and_max_price():
    request = launch_request(config(spot_max_price_usd=0.3, tags={"team": "ml"}), "r", "g4dn.xlarge", 3, "spot", "tok")
    assert request["MinCount"] == request["MaxCount"] == 3 and request["ClientToken"] == "tok"
    assert request["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate", "MaxPrice": "0.300000"}}
    tags = {t["Key"]: t["Value"] for t in request["TagSpecifications"][0]["Tags"]}
    assert tags == {"Name": "thrifty-r", "team": "ml", RUN_TAG: "r", LAUNCH_TAG: "tok", MARKET_TAG: "spot"}
    assert "InstanceMarketOptions" not in launch_request(config(), "r", "g4dn.xlarge", 1, "on_demand", "t")


# -- provisioning ---------------------------------------------------------------------------

def test_on_demand_machines_are_launched_tagged_configured_and_terminated(moto, pricing):
    client, stubber = pricing
    stub_on_demand(stubber, "g4dn.xlarge")
    ec2 = moto.client()
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="thrifty", Description="workers", VpcId=vpc)["GroupId"]
    ec2.create_key_pair(KeyName="thrifty-test")
    moto.client("iam").create_instance_profile(InstanceProfileName="thrifty-worker")
    with provider(moto, client, subnet=subnet, security_groups=[group], key_name="thrifty-test",
                  iam_instance_profile="thrifty-worker", setup_commands=["pip install thrifty"]) as p:
        sent = []
        p.ec2.meta.events.register("provide-client-params.ec2.RunInstances", lambda params, **kw: sent.append(params))
        machines = p.provision("g4dn.xlarge", 2, "on_demand")
        assert [m.state for m in machines] == ["running", "running"]
        assert {m.id for m in p.machines()} == {m.id for m in machines}
        for m in machines:
            assert m.price_per_hour == 0.526 and m.market == "on_demand" and m.host.startswith("10.0.1.")
            record = described(moto, m.id)
            tags = {t["Key"]: t["Value"] for t in record["Tags"]}
            assert tags[RUN_TAG] == "run-1" and tags[MARKET_TAG] == "on_demand"
            assert record["SubnetId"] == subnet and record["KeyName"] == "thrifty-test"
            assert [g["GroupId"] for g in record["SecurityGroups"]] == [group]
            assert "InstanceLifecycle" not in record
            data = ec2.describe_instance_attribute(InstanceId=m.id, Attribute="userData")["UserData"]["Value"]
            assert base64.b64decode(data).decode().endswith("pip install thrifty\n")
        assert sent[0]["IamInstanceProfile"] == {"Name": "thrifty-worker"}
        # moto 5.2 associates the profile with the first instance of a multi-count launch only
        associated = {a["InstanceId"]: a["IamInstanceProfile"]["Arn"]
                      for a in ec2.describe_iam_instance_profile_associations()["IamInstanceProfileAssociations"]}
        assert any(associated.get(m.id, "").endswith("instance-profile/thrifty-worker") for m in machines)
        launches = {next(t["Value"] for t in described(moto, m.id)["Tags"] if t["Key"] == LAUNCH_TAG)
                    for m in machines}
        assert len(launches) == 1  # one all-or-nothing launch
        ended = p.terminate(machines[:1])
        assert ended[0].terminated_at is not None and ended[0].state == "terminated"
        assert described(moto, machines[0].id)["State"]["Name"] in ("shutting-down", "terminated")
        assert [m.id for m in p.machines()] == [machines[1].id]
    assert moto.live_instances() == []  # leaving the block terminated the other one
    stubber.assert_no_pending_responses()


def test_spot_machines_are_spot_instances_priced_in_their_zone(moto, pricing):
    client, _ = pricing  # no Price List answer is queued: a spot launch must not ask for one
    with provider(moto, client) as p:
        (machine,) = p.provision("g4dn.xlarge", 1, "spot")
        record = described(moto, machine.id)
        assert record["InstanceLifecycle"] == "spot" and machine.market == "spot"
        zone = record["Placement"]["AvailabilityZone"]
        history = moto.client().describe_spot_price_history(InstanceTypes=["g4dn.xlarge"])["SpotPriceHistory"]
        assert machine.price_per_hour == float(next(h["SpotPrice"] for h in history if h["AvailabilityZone"] == zone))


@pytest.mark.parametrize("code", sorted(CAPACITY_ERROR_CODES & {
    "InsufficientInstanceCapacity", "InsufficientSpotInstanceCapacity", "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded"}))
def test_capacity_errors_raise_capacity_error_and_start_nothing(moto, code):
    with provider(moto, prices="catalog") as p:
        fired = raise_on(p.ec2, "RunInstances", code, "We currently do not have sufficient capacity")
        with pytest.raises(CapacityError) as info:
            p.provision("p3.8xlarge", 2, "spot")
        assert fired == [1]
        assert (info.value.instance_type, info.value.market) == ("p3.8xlarge", "spot")
        event = info.value.as_preemption()
        assert event.key == ("p3.8xlarge", "spot") and event.source == "capacity" and code in event.reason
        assert p.machines() == [] and moto.live_instances() == []


def test_a_lost_launch_answer_is_found_by_tag_and_terminated(moto):
    with provider(moto, prices="catalog") as p:
        raise_on(p.ec2, "RunInstances", "InternalError", "the answer was lost", when="after-call")
        with pytest.raises(ProviderError, match="InternalError"):
            p.provision("g4dn.xlarge", 2, "on_demand")
        assert moto.live_instances() == []  # terminated by provision itself, not by close()
        records = p.billing()
        assert len(records) == 2 and all(r["terminated_at"] is not None for r in records)
        assert all(r["billed_s"] == 60.0 for r in records)  # the minimum is still charged


def test_ctrl_c_while_waiting_for_running_terminates_the_launch(moto):
    with provider(moto, prices="catalog") as p:
        def interrupt(**kwargs):
            raise KeyboardInterrupt

        p.ec2.meta.events.register("before-call.ec2.DescribeInstances", interrupt)
        with pytest.raises(KeyboardInterrupt):
            p.provision("g4dn.xlarge", 2, "on_demand")
        p.ec2.meta.events.unregister("before-call.ec2.DescribeInstances", interrupt)
        assert moto.live_instances() == []
        assert p.machines() == []


def test_timeout_terminates_machines_that_never_ran(moto):
    with provider(moto, prices="catalog", launch_timeout_s=0.3) as p:
        def still_pending(parsed, **kwargs):
            for reservation in parsed.get("Reservations", []):
                for instance in reservation["Instances"]:
                    instance["State"] = {"Code": 0, "Name": "pending"}

        p.ec2.meta.events.register("after-call.ec2.DescribeInstances", still_pending)
        with pytest.raises(ProviderError, match=r"timed out: 0 of 2 running after 0.3 s"):
            p.provision("g4dn.xlarge", 2, "on_demand")
        assert moto.live_instances() == []


def test_spot_instance_ended_by_ec2_while_starting_is_a_capacity_error(moto):
    reclaimed = fixture("ec2_spot_instance_reclaimed")["response"]
    with provider(moto, prices="catalog") as p:
        def reclaim(parsed, **kwargs):
            for reservation in parsed.get("Reservations", []):
                for instance in reservation["Instances"]:
                    instance.update(reclaimed)

        p.ec2.meta.events.register("after-call.ec2.DescribeInstances", reclaim)
        with pytest.raises(CapacityError, match="Server.SpotInstanceTermination"):
            p.provision("g4dn.xlarge", 1, "spot")
        p.ec2.meta.events.unregister("after-call.ec2.DescribeInstances", reclaim)
        assert moto.live_instances() == []


class _Body:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **kwargs):
        yield self.data


THROTTLED = (b"<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded."
             b"</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>")


def throttle(client, operation: str, times: int) -> list[int]:
    """The next `times` requests of `operation` answer RequestLimitExceeded
    without reaching moto (botocore's retry logic sees a real HTTP 503)."""
    sent = [0]

    def handler(request, **kwargs):
        sent[0] += 1
        if sent[0] <= times:
            return AWSResponse(request.url, 503, {}, _Body(THROTTLED))
        return None

    client.meta.events.register(f"before-send.ec2.{operation}", handler)
    return sent


def test_throttled_launch_is_retried_with_backoff(moto):
    with provider(moto, prices="catalog") as p:
        sent = throttle(p.ec2, "RunInstances", times=1)
        machines = p.provision("g4dn.xlarge", 2, "on_demand")
        assert sent == [2] and len(machines) == 2
        assert len(moto.live_instances()) == 2  # the throttled attempt launched nothing


def test_throttling_past_the_retry_budget_fails_cleanly(moto):
    with provider(moto, prices="catalog", retries={"mode": "standard", "max_attempts": 1}) as p:
        throttle(p.ec2, "RunInstances", times=1)
        with pytest.raises(ProviderError, match="RequestLimitExceeded"):
            p.provision("g4dn.xlarge", 1, "on_demand")


# -- credentials and region ---------------------------------------------------------------

def test_missing_credentials_fail_before_anything_is_started(moto, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ProviderError, match="no usable AWS credentials.*Nothing was started"):
        provider(moto, prices="catalog")


def test_rejected_credentials_fail_before_anything_is_started(moto):
    sts = moto.client("sts")
    raise_on(sts, "GetCallerIdentity", "InvalidClientTokenId", "The security token included in the request is "
             "invalid.", service="sts")
    with pytest.raises(ProviderError, match="AWS rejected the credentials \\(InvalidClientTokenId"):
        Ec2Provider("run-1", config(prices="catalog"), endpoint_url=moto.url, sts=sts)


def test_cleanup_without_a_region_is_bad_input(moto, monkeypatch, capsys):
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    assert main(["cleanup", "--run", "x"]) == 2
    assert "no AWS region" in capsys.readouterr().err


# -- interruptions ------------------------------------------------------------------------

def wait_for_events(p: Ec2Provider, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = p.poll_interruptions()
        if events:
            return events
        time.sleep(0.02)
    raise AssertionError(f"no interruption seen in {timeout_s} s")


def test_machine_ended_outside_the_provider_is_a_describe_preemption(moto):
    reclaimed = fixture("ec2_spot_instance_reclaimed")["response"]
    with provider(moto, prices="catalog") as p:
        machines = p.provision("g4dn.xlarge", 2, "spot")
        gone = machines[0]
        moto.client().terminate_instances(InstanceIds=[gone.id])  # EC2 takes it back

        def as_reclaimed(parsed, **kwargs):  # what AWS says about a reclaimed spot instance (moto cannot)
            for reservation in parsed.get("Reservations", []):
                for instance in reservation["Instances"]:
                    if instance["InstanceId"] == gone.id:
                        instance.update(reclaimed)

        p.ec2.meta.events.register("after-call.ec2.DescribeInstances", as_reclaimed)
        (event,) = wait_for_events(p)
        assert (event.source, event.machine_id, event.key, event.time_left_s) == (
            "describe", gone.id, ("g4dn.xlarge", "spot"), 0.0)
        assert event.reason == "Server.SpotInstanceTermination: Spot instance termination"
        assert event.at == timegm((2026, 11, 21, 10, 15, 42))
        assert [m.id for m in p.machines()] == [machines[1].id]
        time.sleep(0.05)
        assert p.poll_interruptions() == []  # reported once


def test_stopped_machine_is_reported_and_given_back(moto):
    with provider(moto, prices="catalog") as p:
        (machine,) = p.provision("g4dn.xlarge", 1, "spot")
        moto.client().stop_instances(InstanceIds=[machine.id])
        (event,) = wait_for_events(p)
        assert event.machine_id == machine.id and "UserInitiatedShutdown" in event.reason
        assert described(moto, machine.id)["State"]["Name"] in ("shutting-down", "terminated")


def test_imds_notice_reaches_the_driver_once_with_the_time_left(moto):
    servers: dict[str, ImdsServer] = {}

    def imds_url(machine):
        servers[machine.id] = ImdsServer(machine.id).start()
        return servers[machine.id].url

    p = Ec2Provider("run-1", config(prices="catalog"), endpoint_url=moto.url, imds_url=imds_url)
    try:
        with p:
            machines = p.provision("g4dn.xlarge", 2, "spot")
            notice_at = servers[machines[0].id].interrupt("terminate", in_s=120)
            (event,) = wait_for_events(p)
            assert (event.source, event.machine_id, event.key) == ("imds", machines[0].id, ("g4dn.xlarge", "spot"))
            assert 110 < event.time_left_s <= 120 and abs(event.at + event.time_left_s - notice_at) < 1
            moto.client().terminate_instances(InstanceIds=[machines[0].id])  # two minutes later
            time.sleep(0.05)
            assert p.poll_interruptions() == []  # the describe path does not report it again
            assert [m.id for m in p.machines()] == [machines[1].id]
    finally:
        for server in servers.values():
            server.close()


# -- cost, exits, cleanup ---------------------------------------------------------------------

def test_cost_is_per_second_with_a_60_s_minimum(moto, pricing):
    client, stubber = pricing
    stub_on_demand(stubber, "g4dn.xlarge")
    now = [0.0]
    p = Ec2Provider("run-1", config(), endpoint_url=moto.url, pricing=client, clock=lambda: now[0])
    with p:
        (short,) = p.provision("g4dn.xlarge", 1)
        (long,) = p.provision("g4dn.xlarge", 1)  # the price is cached: one Price List call
        now[0] = short.launched_at + 30.0
        p.terminate([short])
        now[0] = long.launched_at + 125.5
        p.terminate([long])
        assert p.cost_usd() == pytest.approx(0.526 * (60.0 + 125.5) / 3600)
        assert sorted(r["billed_s"] for r in p.billing()) == [60.0, 125.5]


def test_error_inside_the_block_terminates_everything(moto):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="training crashed"):
        with provider(moto, prices="catalog") as p:
            p.provision("g4dn.xlarge", 2, "on_demand")
            p.provision("p3.2xlarge", 1, "spot")  # moto accepts p3.2xlarge though its type list lacks it
            if before == signal.SIG_DFL:  # while machines are owned, SIGTERM unwinds the block
                assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
            raise RuntimeError("training crashed")
    assert moto.live_instances() == []
    assert signal.getsignal(signal.SIGTERM) == before  # and the program's own handling is back


def test_close_also_terminates_run_instances_it_has_no_record_of(moto):
    ec2 = moto.client()
    tag = lambda run: [{"ResourceType": "instance", "Tags": [{"Key": RUN_TAG, "Value": run}]}]  # noqa: E731
    orphan = ec2.run_instances(ImageId=AMI, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1,
                               TagSpecifications=tag("run-1"))["Instances"][0]["InstanceId"]
    other = ec2.run_instances(ImageId=AMI, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1,
                              TagSpecifications=tag("run-2"))["Instances"][0]["InstanceId"]
    provider(moto, prices="catalog").close()
    assert described(moto, orphan)["State"]["Name"] in ("shutting-down", "terminated")
    assert described(moto, other)["State"]["Name"] == "running"
    ec2.terminate_instances(InstanceIds=[other])


SIGNAL_SCRIPT = TERMINAL + """
import sys, time
from thrifty.runtime.providers.config import parse_cluster_config
from thrifty.runtime.providers.ec2 import Ec2Provider
config = parse_cluster_config({"region": "us-east-1", "ami": "ami-0123456789abcdef0", "prices": "catalog",
                               "poll_interval_s": 0.02})
with Ec2Provider("signal-run", config, endpoint_url=sys.argv[1]) as p:
    p.provision("g4dn.xlarge", 2, "spot")
    print("ready", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_and_sigterm_terminate_the_runs_machines(moto, sig):
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_SCRIPT, moto.url], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ), text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and proc.stdout.readline().strip() == "ready", proc.stderr.read()
        assert len(moto.live_instances()) == 2
        proc.send_signal(sig)
        proc.wait(timeout=120)  # terminating takes a few calls to moto: seconds, many more on a loaded host
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode != 0
    assert moto.live_instances() == []


def test_cleanup_terminates_a_runs_leftovers_by_tag(moto, monkeypatch, capsys):
    ec2 = moto.client()
    for run, count in (("dead-run", 2), ("live-run", 1)):
        ec2.run_instances(ImageId=AMI, InstanceType="g4dn.xlarge", MinCount=count, MaxCount=count,
                          TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": RUN_TAG, "Value": run}]}])
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal: nothing is asked
    assert main(["cleanup", "--run", "live-run", "--region", REGION]) == 1
    assert "nothing terminated" in capsys.readouterr().out and len(moto.live_instances()) == 3
    assert main(["cleanup", "--run", "dead-run", "--region", REGION, "--yes"]) == 0
    assert "terminated 2 instance(s)" in capsys.readouterr().out
    left = moto.live_instances()
    assert len(left) == 1
    assert main(["cleanup", "--run", "dead-run", "--region", REGION]) == 0
    assert "no instances left" in capsys.readouterr().out
    ec2.terminate_instances(InstanceIds=[left[0][0]])


# -- prices and the catalog refresh --------------------------------------------------------

def test_on_demand_price_from_the_price_list(pricing):
    client, stubber = pricing
    stub_on_demand(stubber, "g4dn.xlarge")
    prices = ApiPrices(REGION, ec2=None, pricing=client)
    assert prices.price("g4dn.xlarge", "on_demand") == 0.526  # the Reserved term's $0.331 is not it
    assert prices.price("g4dn.xlarge", "on_demand") == 0.526  # cached: one API call


def test_price_list_with_no_product_or_several_prices_is_an_error(pricing):
    client, stubber = pricing
    f = fixture("pricing_get_products_g4dn_xlarge")
    stubber.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []}, f["expected_params"])
    with pytest.raises(ProviderError, match="no Linux on-demand price for g4dn.xlarge"):
        ApiPrices(REGION, ec2=None, pricing=client).price("g4dn.xlarge", "on_demand")
    doubled = f["response"]["PriceList"] + [f["response"]["PriceList"][0].replace("0.5260000000", "0.6000000000")]
    stubber.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": doubled}, f["expected_params"])
    with pytest.raises(ProviderError, match=r"several on-demand prices: \$0.526 .*\$0.6 "):
        ApiPrices(REGION, ec2=None, pricing=client).price("g4dn.xlarge", "on_demand")
    stubber.add_client_error("get_products", "AccessDeniedException", "not authorized")
    with pytest.raises(ProviderError, match="lack this permission"):
        ApiPrices(REGION, ec2=None, pricing=client).price("g4dn.xlarge", "on_demand")


def test_spot_price_is_the_newest_per_zone_and_their_median():
    ec2 = boto3.session.Session(region_name=REGION).client("ec2")
    with Stubber(ec2) as stubber:
        expected = {"InstanceTypes": ["g4dn.xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY}
        stubber.add_response("describe_spot_price_history",
                             fixture("ec2_describe_spot_price_history_g4dn_xlarge")["response"], expected)
        prices = ApiPrices(REGION, ec2=ec2, pricing=None)
        assert prices.spot_by_zone("g4dn.xlarge") == {"us-east-1a": 0.201, "us-east-1b": 0.186, "us-east-1c": 0.1869,
                                                      "us-east-1d": 0.1845, "us-east-1f": 0.1872}
        assert prices.price("g4dn.xlarge", "spot") == 0.1869
        assert prices.price("g4dn.xlarge", "spot", zone="us-east-1b") == 0.186


def test_catalog_refresh_writes_todays_prices_the_solver_can_load(moto, pricing, monkeypatch, tmp_path, capsys):
    client, stubber = pricing
    for t in ("g4dn.xlarge", "p3.2xlarge"):
        stub_on_demand(stubber, t)
    import thrifty.runtime.commands.catalog as catalog_command

    monkeypatch.setattr(catalog_command, "make_clients",
                        lambda session, region: (moto.client("ec2", region), moto.client("sts", region), client))
    out = tmp_path / "refreshed.json"
    assert main(["catalog", "refresh", "--region", REGION, "--types", "g4dn.xlarge,p3.2xlarge",
                 "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    catalog = load_catalog(out)
    today = datetime.now(timezone.utc).date().isoformat()  # the refresh dates prices in UTC
    assert set(catalog.types) == {"g4dn.xlarge", "p3.2xlarge"} and catalog.provenance["date"] == today
    g4 = catalog.get("g4dn.xlarge")
    assert (g4.on_demand_usd_per_hour, g4.price_date, g4.gpus, g4.device) == (0.526, today, 1, "T4")
    assert "Price List API" in g4.price_source and "describe_spot_price_history" in g4.price_source
    assert g4.spot_usd_per_hour == 0.00001  # moto's placeholder spot price, passed through unchanged
    assert catalog.get("p3.2xlarge").on_demand_usd_per_hour == 3.06
    stubber.assert_no_pending_responses()


def test_catalog_refresh_of_another_region_drops_prices_it_cannot_read(moto, pricing):
    client, stubber = pricing
    f = fixture("pricing_get_products_g4dn_xlarge")
    params = {"ServiceCode": "AmazonEC2", "Filters": [
        dict(x, Value="eu-north-1") if x["Field"] == "regionCode" else x for x in f["expected_params"]["Filters"]]}
    stubber.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []}, params)
    base = read_json(DEFAULT_CATALOG)
    refreshed = refresh_catalog(base, region="eu-north-1", ec2=moto.client("ec2", "eu-north-1"), pricing=client,
                                types=["g4dn.xlarge"], today=date(2026, 11, 21))
    (row,) = refreshed["instance_types"]
    assert row["on_demand_usd_per_hour"] is None and row["price_date"] is None
    assert any("no on-demand price in this region" in n for n in row["notes"])
    parse_catalog(refreshed, source="refreshed")  # still a catalog the solver loads


def test_catalog_refresh_unknown_type_is_bad_input_before_any_aws_call(capsys):
    assert main(["catalog", "refresh", "--region", REGION, "--types", "g4dn.xlargee"]) == 2
    assert "closest known: g4dn.xlarge" in capsys.readouterr().err


def test_catalog_refresh_of_a_bad_base_names_its_field_before_any_aws_call(tmp_path, capsys, monkeypatch):
    base = read_json(DEFAULT_CATALOG)
    base["instance_types"][1]["network_gbps"] = 0
    path = tmp_path / "base.json"
    write_json(path, base)

    def no_session(*args, **kwargs):
        raise AssertionError("a bad base catalog must stop the command before it opens an AWS session")

    monkeypatch.setattr("thrifty.runtime.providers._aws.make_session", no_session)
    assert main(["catalog", "refresh", "--region", REGION, "--base", str(path), "--out", str(tmp_path / "o.json")]) == 2
    assert f"{path}: instance_types[1].network_gbps: is 0, but must be greater than 0" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
