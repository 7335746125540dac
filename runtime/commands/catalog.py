"""``thrifty catalog refresh``: a new instance catalog with today's prices
from the AWS APIs (issue 7): on-demand from the Price List API, spot from the
spot price history, hardware facts from a base catalog (the shipped one by
default). The file has the shipped format, the date and the source of every
price; name it in a problem's ``catalog`` field for the solver to use it."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from thrifty.runtime.cli import EXIT_OK
from thrifty.runtime.commands._args import output_file, with_exit_codes

HELP = "refresh the instance catalog's prices from the AWS APIs (Price List, spot price history)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: "the catalog was written", 1: "an AWS API call failed"})
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    refresh = actions.add_parser(
        "refresh", help="write a catalog with today's on-demand and spot prices",
        description="Write a new instance catalog with today's prices from the AWS APIs: on-demand from the "
                    "Price List API, spot from the spot price history; hardware facts from a base catalog. "
                    "Name the file in a problem's \"catalog\" field for the solver to use it.")
    refresh.add_argument("--region", help="AWS region to price (default: the profile's or AWS_DEFAULT_REGION)")
    refresh.add_argument("--out", type=output_file, metavar="FILE",
                         help="where to write it (default: aws-REGION-DATE.json here)")
    refresh.add_argument("--base", metavar="CATALOG.json",
                         help="hardware facts and the types to price (default: the shipped catalog)")
    refresh.add_argument("--types", metavar="T1,T2", help="price only these types (default: all in the base)")
    refresh.add_argument("--profile", help="AWS profile to use")


def make_clients(session: Any, region: str) -> tuple[Any, Any, Any]:
    """(ec2 in `region`, sts, the Price List client) with the default retries."""
    from thrifty.runtime.providers._aws import make_client
    from thrifty.runtime.providers.pricing import PRICING_REGION

    return (make_client(session, "ec2", region=region), make_client(session, "sts", region=region),
            make_client(session, "pricing", region=PRICING_REGION))


def run(args: argparse.Namespace) -> int:
    from thrifty.datasets.catalog import DEFAULT_CATALOG, parse_catalog_file
    from thrifty.core.io import read_json, write_json
    from thrifty.runtime.providers._aws import make_session, verify_credentials
    from thrifty.runtime.providers.pricing import base_rows, catalog_types, refresh_catalog

    base_path = Path(args.base) if args.base else DEFAULT_CATALOG
    base = parse_catalog_file(read_json(base_path), str(base_path)).to_json()  # a bad base stops here
    types = [t.strip() for t in args.types.split(",") if t.strip()] if args.types else None
    catalog_types(base_rows(base), types, str(base_path))  # bad input stops before any AWS call
    session = make_session(args.profile, args.region)
    region = session.region_name
    ec2, sts, pricing = make_clients(session, region)
    verify_credentials(sts)
    today = datetime.now(timezone.utc).date()
    catalog = refresh_catalog(base, region=region, ec2=ec2, pricing=pricing, types=types, today=today,
                              base_source=str(base_path))
    out = Path(args.out) if args.out else Path(f"aws-{region}-{today.isoformat()}.json")
    write_json(out, catalog)  # refresh_catalog checked it against the schema: the solver loads it
    _print_summary(base, catalog, out)
    return EXIT_OK


def _print_summary(base: dict[str, Any], catalog: dict[str, Any], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    old = {row["name"]: row for row in base.get("instance_types", [])}
    table = Table(title=f"{catalog['region']} prices on {catalog['provenance']['date']} (USD per hour)")
    for col in ("type", "on-demand", "was", "spot", "was", "zones"):
        table.add_column(col, justify="left" if col == "type" else "right")
    for row in catalog["instance_types"]:
        before = old.get(row["name"], {})
        table.add_row(row["name"], _usd(row.get("on_demand_usd_per_hour")), _usd(before.get("on_demand_usd_per_hour")),
                      _usd(row.get("spot_usd_per_hour")), _usd(before.get("spot_usd_per_hour")),
                      str(len(row.get("spot_observations_usd_per_hour") or {})))
    Console().print(table)
    print(f"wrote {out} ({len(catalog['instance_types'])} types); a problem uses it with \"catalog\": \"{out}\"")


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.4f}"
