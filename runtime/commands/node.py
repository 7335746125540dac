"""``thrifty node join --address HEAD``: make this machine a worker node of
the run's Ray cluster; the last line of an EC2 machine's user data
(`thrifty.runtime.cluster.bootstrap.join_script`). `JOIN_DESCRIPTION` says
what it does; `thrifty.runtime.cluster.bootstrap.join_cluster` does it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from thrifty.core.errors import ProblemError, ProviderError
from thrifty.runtime.commands._args import int_at_least, output_file, positive_float, with_exit_codes

JOIN_DESCRIPTION = (
    "Start this machine's Ray worker node and join the cluster whose head is at --address. What is not given comes "
    "from the machine's IMDSv2 metadata service ($THRIFTY_IMDS_URL, else http://169.254.169.254): instance-id, "
    "local-ipv4, instance-type and instance-life-cycle. The node carries the custom resources "
    "thrifty-machine:<id>, thrifty-type:<type> and thrifty-market:<market>, one unit each; every process on it "
    "sees THRIFTY_IMDS_URL. Exit 0 when the node has joined (its daemons keep running), 2 on bad input, 1 when the "
    "metadata service cannot be read or ray start fails.")
HELP = "make this machine a node of a Ray cluster (thrifty node join, the end of an EC2 machine's user data)"


def _checked(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type from a bootstrap check: its `ProblemError` becomes a usage error (exit 2)."""
    def parse(text: str) -> str:
        try:
            check(text)
        except ProblemError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: "", 1: "the node could not join the cluster"})
    from thrifty.runtime.cluster import bootstrap
    from thrifty.runtime.providers.addresses import check_ip, parse_address

    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    join = actions.add_parser("join", help="start this machine's Ray worker node and join the cluster at --address",
                              description=JOIN_DESCRIPTION)
    join.add_argument("--address", required=True, metavar="HOST:PORT", type=_checked(parse_address),
                      help="the Ray head's GCS address, e.g. 10.0.0.5:6379")
    join.add_argument("--node-ip", type=_checked(check_ip),
                      help="this node's IP address (default: the metadata service's local-ipv4)")
    join.add_argument("--machine-id", type=_checked(lambda v: bootstrap.check_name("machine id", v)),
                      help="this machine's id (default: the metadata service's instance-id)")
    join.add_argument("--instance-type", type=_checked(lambda v: bootstrap.check_name("instance type", v)),
                      help="default: the metadata service's instance-type")
    join.add_argument("--market", choices=("spot", "on_demand"),
                      help="default: spot when the metadata service's instance-life-cycle is spot, else on_demand")
    join.add_argument("--num-cpus", type=int_at_least(0), help="CPUs Ray may use (default: Ray's detection)")
    join.add_argument("--num-gpus", type=int_at_least(0), help="GPUs Ray may use (default: Ray's detection)")
    join.add_argument("--log", type=lambda text: Path(output_file(text)), metavar="FILE",
                      help="where ray start's output goes (default: thrifty-node-<machine id>.log in the temporary "
                           "directory)")
    join.add_argument("--timeout", type=positive_float, default=600.0, metavar="S",
                      help="give up when ray start has not joined after S seconds (default 600)")


def run(args: argparse.Namespace) -> int:
    from thrifty.runtime.cluster.bootstrap import join_cluster
    from thrifty.runtime.providers.imds import ImdsClient, instance_identity

    client = ImdsClient()
    given = {key: getattr(args, key) for key in ("node_ip", "machine_id", "instance_type", "market")}
    if None in given.values():
        try:
            identity = instance_identity(client)
        except ProviderError as e:
            raise ProviderError(f"{e} (not on EC2? give --node-ip, --machine-id, --instance-type and --market)") \
                from e
        found = {"node_ip": identity.local_ipv4, "machine_id": identity.instance_id,
                 "instance_type": identity.instance_type, "market": identity.market}
        given = {key: found[key] if value is None else value for key, value in given.items()}
    said = join_cluster(args.address, **given, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
                        imds_url=client.base_url, log_path=args.log, timeout_s=args.timeout)
    print(said, end="" if said.endswith("\n") or not said else "\n")
    print(f"thrifty node join: {given['machine_id']} ({given['instance_type']}, {given['market']}) joined the Ray "
          f"cluster at {args.address} as node {given['node_ip']}", flush=True)
    return 0
