"""``thrifty cleanup --run ID``: terminate the EC2 instances a run left
behind, found by its ``thrifty:run`` tag (issue 7). The ec2 provider already
terminates everything on normal exit, errors and Ctrl-C; this is for a run
whose driver died harder (kill -9, a lost host).

Lists the instances, asks before terminating (``--yes`` does not ask); exit
0 when none is left, 1 when some remain (not confirmed, or a failure)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import Any

from thrifty.runtime.cli import EXIT_FAILURE, EXIT_OK
from thrifty.runtime.commands._args import with_exit_codes

HELP = "terminate the EC2 instances a run left behind (found by its thrifty:run tag)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: "nothing left running", 1: "an instance could not be terminated"})
    parser.add_argument("--run", required=True, metavar="ID", help="the run id (the thrifty:run tag)")
    parser.add_argument("--region", help="AWS region (default: the profile's or AWS_DEFAULT_REGION)")
    parser.add_argument("--profile", help="AWS profile to use")
    parser.add_argument("--yes", action="store_true", help="terminate without asking")


def run(args: argparse.Namespace) -> int:
    from thrifty.runtime.providers._aws import make_client, make_session, verify_credentials
    from thrifty.runtime.providers.ec2 import find_run_instances, instance_market, terminate_instance_ids

    session = make_session(args.profile, args.region)
    region = session.region_name
    ec2 = make_client(session, "ec2", region=region)
    verify_credentials(make_client(session, "sts", region=region))
    left = find_run_instances(ec2, args.run)
    if not left:
        print(f"run {args.run}: no instances left in {region}")
        return EXIT_OK
    _print_instances(args.run, region, left, instance_market)
    if not args.yes and not _confirm(len(left)):
        print(f"nothing terminated; {len(left)} instance(s) of run {args.run} are still there "
              "(pass --yes to terminate without asking)")
        return EXIT_FAILURE
    changes = terminate_instance_ids(ec2, [i["InstanceId"] for i in left])
    for change in changes:
        print(f"{change['InstanceId']}: {change['PreviousState']['Name']} -> {change['CurrentState']['Name']}")
    print(f"run {args.run}: terminated {len(changes)} instance(s) in {region}")
    return EXIT_OK


def _confirm(count: int) -> bool:
    if not sys.stdin.isatty():
        return False
    answer = input(f"terminate these {count} instance(s)? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _print_instances(run_id: str, region: str, instances: list[dict[str, Any]], market_of) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run {run_id}: instances left in {region}")
    for col in ("instance", "type", "market", "state", "launched"):
        table.add_column(col)
    for i in instances:
        launched = i.get("LaunchTime")
        table.add_row(i["InstanceId"], i["InstanceType"], market_of(i).replace("_", "-"), i["State"]["Name"],
                      launched.isoformat(timespec="seconds") if isinstance(launched, datetime) else "")
    Console().print(table)
