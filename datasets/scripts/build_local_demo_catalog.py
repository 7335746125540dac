"""Derive ``datasets/examples/local-demo-catalog.json``: local pseudo machine
types with **demo prices**, for the runtime's miniature Srifty 5.4 scenario
(``datasets/examples/local-demo-srifty54.json``, ``benchmarks/runtime_overheads.py``).

Every type is the shipped catalog's ``local`` row (one CPU worker process on
this host, device ``cpu``, so plans are predicted with the measured CPU
profiles and the measured local gloo allreduce model); only the name and the
prices differ. The prices are made up for the demo (spot cheaper than
on-demand, two types so a depleted spot market has somewhere to go): they are
not quotes and must not be read as cloud prices.

Run: ``python datasets/scripts/build_local_demo_catalog.py [--check]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "catalog" / "aws-us-east-1.json"
OUT = ROOT / "examples" / "local-demo-catalog.json"
DEMO_SOURCE = "demo price, made up for the local Srifty 5.4 demo (not a quote)"

# name -> (on-demand, spot) USD per hour: demo values. Both types run the same
# worker, so the solver tells them apart by price alone: "local-a" is the
# cheapest on spot, "local-b" the next choice once local-a's spot market is gone.
DEMO_PRICES = {
    "local-a": (1.20, 0.40),
    "local-b": (0.90, 0.55),
}


def build(source: Path = SOURCE) -> dict:
    """The catalog, checked against (and laid out by) its schema, `thrifty.datasets.catalog.CatalogFile`."""
    from thrifty.datasets.catalog import parse_catalog_file

    data = json.loads(source.read_text())
    local = next(row for row in data["instance_types"] if row["name"] == "local")
    rows = []
    for name, (on_demand, spot) in DEMO_PRICES.items():
        rows.append({**local, "name": name, "on_demand_usd_per_hour": on_demand, "spot_usd_per_hour": spot,
                     "price_date": None, "price_source": DEMO_SOURCE,
                     "notes": [*local.get("notes", []), "demo prices: not measured, not published"]})
    return parse_catalog_file({
        "format": data["format"], "provider": "local", "region": "localhost",
        "provenance": {"kind": "derived", "script": "datasets/scripts/build_local_demo_catalog.py",
                       "inputs": ["datasets/catalog/aws-us-east-1.json (the 'local' row)",
                                  "DEMO_PRICES in the script: made-up demo prices"],
                       "notes": "pseudo machine types for running plans on this host; every price is a demo "
                                "value, not a cloud price"},
        "instance_types": rows,
    }, source=str(OUT)).to_json()


def main(argv: list[str]) -> int:
    text = json.dumps(build(), indent=1) + "\n"
    if "--check" in argv:
        same = OUT.exists() and OUT.read_text() == text
        print(f"{OUT} is {'up to date' if same else 'out of date'}")
        return 0 if same else 1
    sys.path.insert(0, str(ROOT.parent))
    from thrifty.core.io import atomic_write_text

    atomic_write_text(OUT, text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
