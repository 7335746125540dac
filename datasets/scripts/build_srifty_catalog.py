"""Derive ``datasets/catalog/srifty-2022.json``: the shipped AWS catalog with the
hourly prices the Srifty paper used in its case studies (Srifty, MLSys 2022,
Table 3 "Supported instance prices": p3.8xlarge $3.68, g3.8xlarge $0.69,
g4dn.8xlarge and g4dn.2xlarge $0.72, spot prices "at the time of writing").

Only those types are kept, each priced at the paper's rate in both markets, so
the case-study problems in ``datasets/examples/srifty-case*.json`` reproduce
the paper's setting. Run: ``python datasets/scripts/build_srifty_catalog.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "catalog" / "aws-us-east-1.json"
OUT = ROOT / "catalog" / "srifty-2022.json"
PAPER_PRICES = {"p3.8xlarge": 3.68, "g3.8xlarge": 0.69, "g4dn.8xlarge": 0.72, "g4dn.2xlarge": 0.72}
CITATION = "Srifty (MLSys 2022), Table 3 'Supported instance prices' (spot prices at the time of writing)"


def build(source: Path = SOURCE) -> dict:
    """The catalog, checked against (and laid out by) its schema, `thrifty.datasets.catalog.CatalogFile`."""
    from thrifty.datasets.catalog import parse_catalog_file

    data = json.loads(source.read_text())
    rows = []
    for row in data["instance_types"]:
        if row["name"] in PAPER_PRICES:
            price = PAPER_PRICES[row["name"]]
            rows.append({**row, "on_demand_usd_per_hour": price, "spot_usd_per_hour": price,
                         "price_date": "2022", "price_source": CITATION})
    return parse_catalog_file({
        "format": data["format"], "provider": "aws", "region": data["region"],
        "provenance": {"kind": "derived", "script": "datasets/scripts/build_srifty_catalog.py",
                       "inputs": ["datasets/catalog/aws-us-east-1.json", CITATION],
                       "notes": "hardware from the shipped AWS catalog; every price is the paper's hourly rate, "
                                "used for both markets so either market reproduces the paper's costs"},
        "instance_types": rows,
    }, source=str(OUT)).to_json()


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0]) if argv else OUT
    sys.path.insert(0, str(ROOT.parent))
    from thrifty.core.io import write_json

    write_json(out, build())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
