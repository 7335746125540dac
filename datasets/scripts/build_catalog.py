#!/usr/bin/env python
"""Build the shipped AWS us-east-1 instance catalog.

    python datasets/scripts/build_catalog.py            # rewrite datasets/catalog/aws-us-east-1.json
    python datasets/scripts/build_catalog.py --check    # exit 1 if the shipped file is out of date
    python datasets/scripts/build_catalog.py --out X    # write somewhere else

No network. Inputs:

* Hardware facts (GPU count, model, manufacturer, memory per GPU, vCPUs,
  memory, network rating and baseline) come from moto's copy of the AWS
  ``DescribeInstanceTypes`` answer, ``moto/ec2/resources/instance_types.json.gz``
  in the installed ``moto`` package; whether a type is offered in us-east-1
  comes from moto's ``instance_type_offerings/region/us-east-1.json.gz``.
  Types moto no longer carries (p3.2xlarge, p3.8xlarge, p3.16xlarge and the
  g3 family) take their facts from `SPEC_TABLE` below, each row naming its
  published source.
* GPU-to-GPU bandwidth inside one machine comes from `INTERCONNECT` below
  (published NVLink/NVSwitch/PCIe figures, sources named there).
* Prices come from `PRICES` below: on-demand USD/hour and the us-east-1
  spot observations they were read from, with date and source in `SOURCES`.

The output is deterministic (no clock, fixed row order) so that
``tests/test_catalog.py`` can check the shipped file against a fresh build.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any

CATALOG_DATE = "2026-11-21"  # the day this table of prices and specs was compiled
REGION = "us-east-1"
SCRIPT = "datasets/scripts/build_catalog.py"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "catalog" / "aws-us-east-1.json"

# Row order of the output.
TYPES = [
    "local",
    "p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p3dn.24xlarge",
    "g3.4xlarge", "g3.8xlarge", "g3.16xlarge",
    "g4dn.xlarge", "g4dn.2xlarge", "g4dn.4xlarge", "g4dn.8xlarge", "g4dn.12xlarge", "g4dn.16xlarge",
    "g5.xlarge", "g5.2xlarge", "g5.4xlarge", "g5.8xlarge", "g5.12xlarge", "g5.16xlarge", "g5.24xlarge",
    "g5.48xlarge",
    "g6.xlarge", "g6.2xlarge", "g6.4xlarge", "g6.8xlarge", "g6.12xlarge", "g6.16xlarge", "g6.24xlarge",
    "g6.48xlarge",
    "p4d.24xlarge",
    "p5.48xlarge",
]

# GPU name in DescribeInstanceTypes -> the device key compute profiles use.
DEVICE_KEYS = {"V100": "V100", "M60": "M60", "T4": "T4", "A10G": "A10G", "L4": "L4", "A100": "A100", "H100": "H100"}

# ---------------------------------------------------------------------------
# Sources (short key -> full citation). Rows name a key; provenance lists all.
# ---------------------------------------------------------------------------
SKYPILOT_COMMIT = "001367d22a0033fac286a8c71aeac7109e431bcb"
SKYPILOT_WINDOW = "2024-12/2025-05"  # ISO 8601 interval: when the snapshot's prices were observed
SOURCES = {
    "moto": "moto {moto_version}: moto/ec2/resources/instance_types.json.gz (moto's copy of the AWS EC2 "
            "DescribeInstanceTypes answer) and instance_type_offerings/region/us-east-1.json.gz",
    "aws-p3": "AWS News Blog, 'New - Amazon EC2 Instances with Up to 8 NVIDIA Tesla V100 GPUs (P3)', "
              "2017-10-25, and the AWS P3 instance-type page (aws.amazon.com/ec2/instance-types/p3/): "
              "GPUs, GPU memory, vCPUs, memory, network, NVLink 200 GB/s (8xlarge) / 300 GB/s (16xlarge)",
    "aws-g3": "AWS News Blog, 'New - Next-Generation GPU-Powered EC2 Instances (G3)', 2017-07-13, and the "
              "AWS G3 instance-type page (aws.amazon.com/ec2/instance-types/g3/): GPUs, GPU memory, vCPUs, "
              "memory, network rating; on-demand $1.14/$2.28/$4.56 per hour as copied in gist "
              "Geoyi/b84887fad3a36c1d0e4bc14144ba9af1 (2018-03-16)",
    "skypilot": "SkyPilot catalog skypilot-org/skypilot-catalog, catalogs/v7/aws/vms.csv at commit "
                f"{SKYPILOT_COMMIT[:12]} (built by SkyPilot from the AWS Price List API and "
                "DescribeSpotPriceHistory). On-demand = its us-east-1 Linux Price; spot = median of its "
                "per-AZ us-east-1 SpotPrice values. The copy read carries no date: it lists p5en.48xlarge "
                "(GA 2024-12) and pre-June-2025 P4d/P5 on-demand prices, so it was taken in "
                f"{SKYPILOT_WINDOW}",
    "aws-ec2-network": "AWS EC2 User Guide, 'Accelerated computing instances', Network performance table "
                       "with baseline and burst bandwidth (awsdocs/amazon-ec2-user-guide "
                       "doc_source/accelerated-computing-instances.md at commit 5bcb1f4, 2022-11-05, the last "
                       "version listing P3 and G3): p3.2xlarge 2.5 / 10 Gbps, g3.4xlarge 5 / 10 Gbps",
    "srifty": "Srifty (MLSys 2022), Table 3 'Supported instance prices': p3.8xl $3.68, g3.8xl $0.69, "
              "g4dn.2xl/8xl $0.72 per hour, spot prices 'at the time of writing'",
    "nvidia-pcie": "NVIDIA data sheets: Tesla M60, T4 (PCIe Gen3 x16), A10 / A10G and L4 (PCIe Gen4 x16, "
                   "64 GB/s bidirectional); PCI-SIG: Gen3 x16 = 15.75 GB/s and Gen4 x16 = 31.5 GB/s per "
                   "direction",
    "aws-p4d": "AWS P4d instance-type page (aws.amazon.com/ec2/instance-types/p4/): 8 A100 on NVSwitch, "
               "600 GB/s GPU peer-to-peer",
    "aws-p5": "AWS P5 instance-type page (aws.amazon.com/ec2/instance-types/p5/): 8 H100 on NVSwitch, "
              "900 GB/s GPU peer-to-peer",
    "aws-p3dn": "AWS P3 instance-type page (aws.amazon.com/ec2/instance-types/p3/): p3dn.24xlarge, 8 V100 "
                "32 GB on NVLink, 300 GB/s GPU peer-to-peer",
    "aws-price-cut-2025": "AWS cut P4 (P4d, P4de) and P5 (P5, P5en) On-Demand prices by up to 45% in June "
                          "2025 (reported e.g. at usage.ai/blogs/aws/ai-ml-cost/llm-cost-optimization-aws/; "
                          "p5en.48xlarge on-demand reads $63.296 in dstack PR dstackai/dstack#4110, 2026-08, "
                          "against $84.80 in the SkyPilot snapshot)",
}

# How a row's price_source names each price source (the full citation is in SOURCES).
PRICE_LABELS = {
    "skypilot": f"SkyPilot catalog skypilot-org/skypilot-catalog@{SKYPILOT_COMMIT[:12]} "
                "(AWS Price List API, us-east-1 Linux)",
    "aws-g3": "AWS G3 list price (AWS G3 launch pricing, copied in gist Geoyi/b84887fad3a36c1d0e4bc14144ba9af1 "
              "on 2018-03-16)",
    "srifty": "Srifty (MLSys 2022) Table 3",
}

# ---------------------------------------------------------------------------
# Published specs for types absent from moto's data.
# ---------------------------------------------------------------------------
SPEC_TABLE: dict[str, dict[str, Any]] = {
    # gpus, GPU name, GiB per GPU, vCPUs, GiB memory, network rating (AWS wording); for an "Up to"
    # rating, the sustained baseline Gbit/s and the source that publishes it
    "p3.2xlarge": dict(gpus=1, gpu="V100", maker="NVIDIA", gpu_gib=16, vcpus=8, mem_gib=61,
                       rating="Up to 10 Gigabit", source="aws-p3", baseline=2.5, baseline_source="aws-ec2-network"),
    "p3.8xlarge": dict(gpus=4, gpu="V100", maker="NVIDIA", gpu_gib=16, vcpus=32, mem_gib=244,
                       rating="10 Gigabit", source="aws-p3"),
    "p3.16xlarge": dict(gpus=8, gpu="V100", maker="NVIDIA", gpu_gib=16, vcpus=64, mem_gib=488,
                        rating="25 Gigabit", source="aws-p3"),
    "g3.4xlarge": dict(gpus=1, gpu="M60", maker="NVIDIA", gpu_gib=8, vcpus=16, mem_gib=122,
                       rating="Up to 10 Gigabit", source="aws-g3", baseline=5.0, baseline_source="aws-ec2-network"),
    "g3.8xlarge": dict(gpus=2, gpu="M60", maker="NVIDIA", gpu_gib=8, vcpus=32, mem_gib=244,
                       rating="10 Gigabit", source="aws-g3"),
    "g3.16xlarge": dict(gpus=4, gpu="M60", maker="NVIDIA", gpu_gib=8, vcpus=64, mem_gib=488,
                        rating="25 Gigabit", source="aws-g3"),
}

# ---------------------------------------------------------------------------
# GPU-to-GPU bandwidth inside one machine, Gbit/s per GPU per direction (what a
# ring allreduce step can send). Published NVLink/NVSwitch figures are
# bidirectional aggregates per GPU, so they are halved; PCIe figures are per
# direction of an x16 link. One-GPU types carry their host link (PCIe).
# ---------------------------------------------------------------------------
PCIE3_X16_GBPS = 126.0  # 15.75 GB/s per direction
PCIE4_X16_GBPS = 252.0  # 31.5 GB/s per direction


def _nv(gbytes_bidir: float) -> float:
    return gbytes_bidir / 2 * 8


INTERCONNECT: dict[str, tuple[float, str, str]] = {
    # prefix -> (gbps, description, source)
    "p3.2xlarge": (PCIE3_X16_GBPS, "PCIe Gen3 x16 host link (1 GPU)", "nvidia-pcie"),
    "p3.8xlarge": (_nv(200), "NVLink 2.0, 200 GB/s bidirectional aggregate per AWS", "aws-p3"),
    "p3.16xlarge": (_nv(300), "NVLink 2.0, 300 GB/s bidirectional aggregate per AWS", "aws-p3"),
    "p3dn.24xlarge": (_nv(300), "NVLink 2.0, 300 GB/s bidirectional aggregate per AWS", "aws-p3dn"),
    "g3.": (PCIE3_X16_GBPS, "PCIe Gen3 x16 (Tesla M60)", "nvidia-pcie"),
    "g4dn.": (PCIE3_X16_GBPS, "PCIe Gen3 x16 (T4)", "nvidia-pcie"),
    "g5.": (PCIE4_X16_GBPS, "PCIe Gen4 x16 (A10G)", "nvidia-pcie"),
    "g6.": (PCIE4_X16_GBPS, "PCIe Gen4 x16 (L4)", "nvidia-pcie"),
    "p4d.24xlarge": (_nv(600), "NVSwitch, 600 GB/s bidirectional per GPU per AWS", "aws-p4d"),
    "p5.48xlarge": (_nv(900), "NVSwitch, 900 GB/s bidirectional per GPU per AWS", "aws-p5"),
}

# ---------------------------------------------------------------------------
# Prices, USD per hour, us-east-1 Linux. "spot_az": the snapshot's SpotPrice per
# us-east-1 availability zone (AZs without a spot price omitted); the row's
# spot price is their median.
# ---------------------------------------------------------------------------
PRICES: dict[str, dict[str, Any]] = {
    "p3.2xlarge": dict(od=3.06, spot_az={"use1-az1": 0.5197, "use1-az2": 0.7657, "use1-az5": 0.7031,
                                         "use1-az6": 0.6827}),
    "p3.8xlarge": dict(od=12.24, spot_az={"use1-az1": 1.8029, "use1-az2": 2.0691, "use1-az5": 1.7535,
                                          "use1-az6": 2.5461}, srifty=3.68),
    "p3.16xlarge": dict(od=24.48, spot_az={"use1-az1": 4.8549, "use1-az2": 6.2948, "use1-az5": 2.7531,
                                           "use1-az6": 3.5861}),
    "p3dn.24xlarge": dict(od=31.212, spot_az={"use1-az1": 3.8094, "use1-az6": 3.2632}),
    "g3.4xlarge": dict(od=1.14, od_source="aws-g3", od_date="2018-03-16", srifty_scaled_from="g3.8xlarge"),
    "g3.8xlarge": dict(od=2.28, od_source="aws-g3", od_date="2018-03-16", srifty=0.69),
    "g3.16xlarge": dict(od=4.56, od_source="aws-g3", od_date="2018-03-16", srifty_scaled_from="g3.8xlarge"),
    "g4dn.xlarge": dict(od=0.526, spot_az={"use1-az1": 0.2010, "use1-az2": 0.1860, "use1-az4": 0.1869,
                                           "use1-az5": 0.1845, "use1-az6": 0.1872}),
    "g4dn.2xlarge": dict(od=0.752, spot_az={"use1-az1": 0.3163, "use1-az2": 0.3095, "use1-az4": 0.3104,
                                            "use1-az5": 0.3119, "use1-az6": 0.3147}),
    "g4dn.4xlarge": dict(od=1.204, spot_az={"use1-az1": 0.4028, "use1-az2": 0.4247, "use1-az4": 0.4013,
                                            "use1-az5": 0.3999, "use1-az6": 0.3835}),
    "g4dn.8xlarge": dict(od=2.176, spot_az={"use1-az1": 0.7803, "use1-az2": 0.8107, "use1-az4": 0.8219,
                                            "use1-az5": 0.7724, "use1-az6": 0.8056}, srifty=0.72),
    "g4dn.12xlarge": dict(od=3.912, spot_az={"use1-az1": 1.5152, "use1-az2": 1.3849, "use1-az4": 1.4339,
                                             "use1-az5": 1.3266, "use1-az6": 1.2684}),
    "g4dn.16xlarge": dict(od=4.352, spot_az={"use1-az1": 1.1307, "use1-az2": 1.1368, "use1-az4": 1.1119,
                                             "use1-az5": 1.1115, "use1-az6": 1.0867}),
    "g5.xlarge": dict(od=1.006, spot_az={"use1-az1": 0.4177, "use1-az2": 0.3970, "use1-az4": 0.4130,
                                         "use1-az5": 0.4028, "use1-az6": 0.4005}),
    "g5.2xlarge": dict(od=1.212, spot_az={"use1-az1": 0.5609, "use1-az2": 0.6067, "use1-az4": 0.5063,
                                          "use1-az5": 0.4288, "use1-az6": 0.4799}),
    "g5.4xlarge": dict(od=1.624, spot_az={"use1-az1": 0.6507, "use1-az2": 0.6401, "use1-az4": 0.6709,
                                          "use1-az5": 0.6662, "use1-az6": 0.6280}),
    "g5.8xlarge": dict(od=2.448, spot_az={"use1-az1": 0.9629, "use1-az2": 0.9686, "use1-az4": 0.9678,
                                          "use1-az5": 1.0173, "use1-az6": 1.0377}),
    "g5.12xlarge": dict(od=5.672, spot_az={"use1-az1": 1.9937, "use1-az2": 2.1378, "use1-az4": 2.5445,
                                           "use1-az5": 2.7041, "use1-az6": 2.7324}),
    "g5.16xlarge": dict(od=4.096, spot_az={"use1-az1": 1.5724, "use1-az2": 1.6052, "use1-az4": 1.6950,
                                           "use1-az5": 1.7912, "use1-az6": 1.7492}),
    "g5.24xlarge": dict(od=8.144, spot_az={"use1-az1": 2.9657, "use1-az2": 3.4692, "use1-az4": 3.7717,
                                           "use1-az5": 3.8213, "use1-az6": 3.8418}),
    "g5.48xlarge": dict(od=16.288, spot_az={"use1-az1": 3.9266, "use1-az2": 4.0702, "use1-az4": 4.3882,
                                            "use1-az5": 4.6261, "use1-az6": 4.3694}),
    "g6.xlarge": dict(od=0.8048, spot_az={"use1-az1": 0.4155, "use1-az2": 0.3879, "use1-az4": 0.4102,
                                          "use1-az6": 0.4173}),
    "g6.2xlarge": dict(od=0.9776, spot_az={"use1-az1": 0.4265, "use1-az2": 0.3689, "use1-az4": 0.4520,
                                           "use1-az6": 0.4196}),
    "g6.4xlarge": dict(od=1.3232, spot_az={"use1-az1": 0.5226, "use1-az2": 0.5132, "use1-az4": 0.5678,
                                           "use1-az6": 0.6280}),
    "g6.8xlarge": dict(od=2.0144, spot_az={"use1-az1": 0.9008, "use1-az2": 0.9064, "use1-az4": 0.9389,
                                           "use1-az6": 0.9390}),
    "g6.12xlarge": dict(od=4.6016, spot_az={"use1-az1": 1.9438, "use1-az2": 2.3398, "use1-az4": 1.9139,
                                            "use1-az6": 1.8626}),
    "g6.16xlarge": dict(od=3.3968, spot_az={"use1-az1": 1.2184, "use1-az2": 1.1822, "use1-az4": 1.3405,
                                            "use1-az6": 1.2724}),
    "g6.24xlarge": dict(od=6.6752, spot_az={"use1-az1": 3.0273, "use1-az2": 2.3970, "use1-az4": 3.2133,
                                            "use1-az6": 3.2464}),
    "g6.48xlarge": dict(od=13.3504, spot_az={"use1-az1": 2.9627, "use1-az2": 3.1769, "use1-az4": 4.0286,
                                             "use1-az6": 4.0711}),
    "p4d.24xlarge": dict(od=32.7726, spot_az={"use1-az1": 6.7915, "use1-az2": 9.6107, "use1-az6": 5.0933},
                         stale="aws-price-cut-2025"),
    "p5.48xlarge": dict(od=98.32, spot_az={"use1-az1": 30.3260, "use1-az2": 27.6948, "use1-az3": 20.9934,
                                           "use1-az4": 29.3511, "use1-az5": 25.8774, "use1-az6": 25.3026},
                        stale="aws-price-cut-2025"),
}

# The local type: one worker process on this host, no charge.
LOCAL_NETWORK_GBPS = 10.0
LOCAL_ROW_NOTES = (
    "One worker process on this host (device 'cpu'); vCPUs and memory depend on the host and are not "
    "recorded. network_gbps is a nominal loopback figure (the Linux loopback device reports no link "
    "speed; 10 Gbit/s is a deliberately round, conservative placeholder): local allreduce costs come "
    "from the shipped allreduce probe data, not from this number."
)


def _round(x: float, nd: int = 4) -> float:
    return float(round(x, nd))


def parse_network_rating(rating: str) -> float:
    """Gbit/s from an AWS network rating: 'Up to 10 Gigabit' -> 10, '4x 100 Gigabit' -> 400."""
    m = re.fullmatch(r"\s*(?:Up to\s+)?(?:(\d+)x\s+)?(\d+(?:\.\d+)?)\s+Gigabit\s*", rating)
    if not m:
        raise ValueError(f"unrecognised network rating {rating!r}")
    count = int(m.group(1) or 1)
    return float(count * float(m.group(2)))


def moto_paths() -> tuple[str, Path, Path]:
    import moto  # the dev extra; this script needs it, the package does not

    root = Path(os.path.dirname(moto.__file__)) / "ec2" / "resources"
    return (
        str(getattr(moto, "__version__", "unknown")),
        root / "instance_types.json.gz",
        root / "instance_type_offerings" / "region" / f"{REGION}.json.gz",
    )


def load_moto() -> tuple[str, dict[str, Any], set[str]]:
    version, types_path, offerings_path = moto_paths()
    with gzip.open(types_path, "rt", encoding="utf-8") as f:
        types = json.load(f)
    with gzip.open(offerings_path, "rt", encoding="utf-8") as f:
        offerings = json.load(f)
    offered = {o["InstanceType"] for o in offerings} if isinstance(offerings, list) else set(offerings)
    return version, types, offered


def hardware(name: str, moto_types: dict[str, Any]) -> dict[str, Any]:
    """Hardware facts for `name`: from moto when it has the type, else SPEC_TABLE."""
    rec = moto_types.get(name)
    if rec is not None:
        gpus = rec.get("GpuInfo", {}).get("Gpus", [])
        if len(gpus) != 1:
            raise ValueError(f"{name}: expected one GPU kind in moto's data, found {len(gpus)}")
        g = gpus[0]
        cards = rec.get("NetworkInfo", {}).get("NetworkCards", [])
        baseline = sum(float(c.get("BaselineBandwidthInGbps") or 0.0) for c in cards) or None
        return dict(
            gpus=int(g["Count"]), gpu=str(g["Name"]), maker=str(g["Manufacturer"]),
            gpu_gib=_round(g["MemoryInfo"]["SizeInMiB"] / 1024, 2),
            vcpus=int(rec["VCpuInfo"]["DefaultVCpus"]),
            mem_gib=_round(rec["MemoryInfo"]["SizeInMiB"] / 1024, 2),
            rating=str(rec["NetworkInfo"]["NetworkPerformance"]),
            baseline=baseline, source="moto",
        )
    if name in SPEC_TABLE:
        return {"baseline": None, **SPEC_TABLE[name]}
    raise ValueError(f"{name}: not in moto's DescribeInstanceTypes data and not in SPEC_TABLE")


def interconnect(name: str) -> tuple[float, str, str]:
    if name in INTERCONNECT:
        return INTERCONNECT[name]
    family = name.split(".")[0] + "."
    if family in INTERCONNECT:
        return INTERCONNECT[family]
    raise ValueError(f"{name}: no interconnect figure in INTERCONNECT")


def prices(name: str) -> dict[str, Any]:
    """On-demand and spot price of `name`, with dates, sources and the figures they rest on."""
    p = PRICES[name]
    out: dict[str, Any] = {"on_demand_usd_per_hour": p["od"]}
    od_source = p.get("od_source", "skypilot")
    od_date = p.get("od_date", SKYPILOT_WINDOW)
    notes: list[str] = []
    if "spot_az" in p:
        obs = list(p["spot_az"].values())
        out["spot_usd_per_hour"] = _round(statistics.median(obs))
        spot_source, spot_date = "skypilot", SKYPILOT_WINDOW
        spot_how = f"median of {len(obs)} us-east-1 AZ spot prices"
    elif "srifty" in p:
        out["spot_usd_per_hour"] = p["srifty"]
        spot_source, spot_date = "srifty", "2022"
        spot_how = f"{name} spot ${p['srifty']} 'at the time of writing'"
    elif "srifty_scaled_from" in p:
        ref = PRICES[p["srifty_scaled_from"]]
        out["spot_usd_per_hour"] = _round(ref["srifty"] * p["od"] / ref["od"])
        spot_source, spot_date = "srifty", "2022"
        spot_how = (f"{p['srifty_scaled_from']} spot ${ref['srifty']} scaled by the on-demand ratio "
                    f"{p['od']}/{ref['od']} (same spot discount)")
    else:
        raise ValueError(f"{name}: no spot price")
    out["price_date"] = od_date
    if od_source == spot_source:
        out["price_source"] = f"{PRICE_LABELS[od_source]}: on-demand list price; spot = {spot_how}"
    else:
        out["price_source"] = (f"on-demand: {PRICE_LABELS[od_source]}; "
                               f"spot: {PRICE_LABELS[spot_source]}, {spot_how}")
    out["on_demand_price_source"] = od_source
    out["spot_price_date"] = spot_date
    out["spot_price_source"] = spot_source
    if "spot_az" in p:
        out["spot_observations_usd_per_hour"] = dict(p["spot_az"])
    if "srifty" in p and "spot_az" in p:
        out["spot_usd_per_hour_srifty2022"] = p["srifty"]
        notes.append("Srifty (MLSys 2022) Table 3 quotes a spot price for this type too "
                     "(spot_usd_per_hour_srifty2022); the catalog uses the newer snapshot")
    if "stale" in p:
        notes.append("on-demand price predates AWS's June 2025 P4/P5 On-Demand price cut (up to 45%, "
                     f"source '{p['stale']}'); refresh before relying on it")
    out["_notes"] = notes
    return out


def build_row(name: str, moto_types: dict[str, Any], offered: set[str]) -> dict[str, Any]:
    hw = hardware(name, moto_types)
    device = DEVICE_KEYS.get(hw["gpu"])
    if device is None:
        raise ValueError(f"{name}: GPU {hw['gpu']!r} has no device key in DEVICE_KEYS")
    ic_gbps, ic_desc, ic_source = interconnect(name)
    pr = prices(name)
    notes = pr.pop("_notes")
    if hw.get("baseline_source"):
        notes.append(f"network_baseline_gbps from source '{hw['baseline_source']}' (moto no longer carries the type)")
    if name not in offered:
        notes.append(f"absent from moto's {REGION} instance-type offerings (previous generation); the "
                     "type may no longer be launchable, kept for paper reproduction")
    row: dict[str, Any] = {
        "name": name,
        "gpus": hw["gpus"],
        "device": device,
        "gpu_model": f"{hw['maker']} {hw['gpu']}",
        "gpu_memory_gib": float(hw["gpu_gib"]),
        "vcpus": hw["vcpus"],
        "memory_gib": float(hw["mem_gib"]),
        "network_gbps": parse_network_rating(hw["rating"]),
        "network_rating": hw["rating"],
        "interconnect_gbps": ic_gbps,
        "on_demand_usd_per_hour": pr.pop("on_demand_usd_per_hour"),
        "spot_usd_per_hour": pr.pop("spot_usd_per_hour"),
        "price_date": pr.pop("price_date"),
        "price_source": pr.pop("price_source"),
        # Fields below are extra: the loader ignores them.
        "gpu_memory_total_gib": _round(hw["gpu_gib"] * hw["gpus"], 2),
        "network_baseline_gbps": hw["baseline"],
        "interconnect": ic_desc,
        "interconnect_source": ic_source,
        "hardware_source": hw["source"],
        "offered_in_region": name in offered,
        **pr,
    }
    if notes:
        row["notes"] = notes
    return row


def local_row() -> dict[str, Any]:
    return {
        "name": "local",
        "gpus": 1,
        "device": "cpu",
        "gpu_model": "none (CPU worker process)",
        "gpu_memory_gib": 0.0,
        "vcpus": 1,
        "memory_gib": 0.0,
        "network_gbps": LOCAL_NETWORK_GBPS,
        "network_rating": "loopback (nominal)",
        "interconnect_gbps": None,
        "on_demand_usd_per_hour": 0.0,
        "spot_usd_per_hour": 0.0,
        "price_date": CATALOG_DATE,
        "price_source": "local host: no charge",
        "hardware_source": "local",
        "offered_in_region": True,
        "notes": [LOCAL_ROW_NOTES, "interconnect_gbps is null: one worker has no GPU peer"],
    }


def build() -> dict[str, Any]:
    """The catalog, checked against (and laid out by) its schema, `thrifty.datasets.catalog.CatalogFile`."""
    from thrifty.datasets.catalog import CATALOG_FORMAT, parse_catalog_file

    moto_version, moto_types, offered = load_moto()
    rows = [local_row() if name == "local" else build_row(name, moto_types, offered) for name in TYPES]
    keys = ("hardware_source", "interconnect_source", "on_demand_price_source", "spot_price_source")
    used = {r.get(k) for r in rows for k in keys} | {p["stale"] for p in PRICES.values() if "stale" in p}
    used |= {s["baseline_source"] for s in SPEC_TABLE.values() if "baseline_source" in s}
    sources = {k: v.format(moto_version=moto_version) for k, v in SOURCES.items() if k in used}
    return parse_catalog_file({
        "format": CATALOG_FORMAT,
        "provider": "aws",
        "region": REGION,
        "provenance": {
            "kind": "derived",
            "script": SCRIPT,
            "date": CATALOG_DATE,
            "inputs": [
                f"moto {moto_version} ec2/resources/instance_types.json.gz (published: AWS DescribeInstanceTypes)",
                f"moto {moto_version} ec2/resources/instance_type_offerings/region/{REGION}.json.gz",
                "SPEC_TABLE, INTERCONNECT and PRICES tables in the script (published sources below)",
            ],
            "sources": sources,
            "notes": [
                "Built offline by the script; regenerate with: python datasets/scripts/build_catalog.py",
                "Prices are USD per hour, Linux, us-east-1. price_date is an ISO 8601 date or interval "
                "(start/end) in which the on-demand price was observed; spot_price_date likewise for spot.",
                "spot_usd_per_hour is a typical spot price, not a quote: spot prices move by AZ and over time.",
                "gpu_memory_gib is per GPU; gpu_memory_total_gib is the whole machine.",
                "network_gbps is the AWS rating ('Up to N Gigabit' -> N, the burst figure); "
                "network_baseline_gbps is the sustained baseline where AWS publishes one.",
                "interconnect_gbps is GPU-to-GPU bandwidth inside one machine per GPU per direction "
                "(published bidirectional NVLink/NVSwitch figures halved; PCIe x16 per direction for "
                "PCIe-only and one-GPU types).",
                "A later command, 'thrifty catalog refresh', will refresh prices through the AWS APIs.",
            ],
        },
        "instance_types": rows,
    }, source=SCRIPT).to_json()


def render(catalog: dict[str, Any]) -> str:
    return json.dumps(catalog, indent=1) + "\n"


_TOOL_VERSION = re.compile(r"\bmoto \d[\w.+-]*")


def comparable(catalog: Any) -> Any:
    """`catalog` with the version of the installed moto left out of its
    provenance strings: two builds are the same catalog when their data are
    equal, whichever moto release carried the (unchanged) published figures."""
    if isinstance(catalog, dict):
        return {k: comparable(v) for k, v in catalog.items()}
    if isinstance(catalog, list):
        return [comparable(v) for v in catalog]
    if isinstance(catalog, str):
        return _TOOL_VERSION.sub("moto", catalog)
    return catalog


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the catalog")
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if the file at --out differs from a fresh build")
    args = ap.parse_args(argv)
    catalog = build()
    if args.check:
        try:
            current = json.loads(args.out.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            print(f"{args.out}: cannot read ({e})", file=sys.stderr)
            return 1
        if comparable(current) != comparable(catalog):
            print(f"{args.out} is out of date; run: python {SCRIPT}", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date ({len(catalog['instance_types'])} types)")
        return 0
    from thrifty.core.io import atomic_write_text

    atomic_write_text(args.out, render(catalog))
    os.chmod(args.out, 0o644)  # the atomic writer's temp file is private; data files are world-readable
    print(f"wrote {args.out} ({len(catalog['instance_types'])} types)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
