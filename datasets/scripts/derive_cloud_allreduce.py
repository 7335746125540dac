#!/usr/bin/env python
"""Derive the allreduce model of cloud GPU instance types from published figures.

    python datasets/scripts/derive_cloud_allreduce.py            # write datasets/allreduce/cloud-derived-model.json
    python datasets/scripts/derive_cloud_allreduce.py --check    # exit 1 if the shipped file is out of date
    python datasets/scripts/derive_cloud_allreduce.py --table    # print the per-type table (markdown) only

No network, no probes. The model (`thrifty.perfmodels.allreduce.derived`) is a
ring alpha-beta model whose parameters are the published numbers below
(`PARAMETERS`), each with its sources (`SOURCES`, full citations) and the rows
of ``datasets/allreduce/cloud-sources.md`` (the research notes the numbers were
read from) it rests on. Some parameters are assumptions, and say so
(``"basis": "assumed"``, and ``assumption`` for what is assumed in using a
sourced number). No parameter was fitted or tuned: in particular not to the
Srifty case studies (``datasets/examples/srifty-case*.json``), which validate
the model (``datasets/examples/README.md``).

The file also carries, for readers, what the model answers for every GPU type
of the shipped catalog (``table``); ``--table`` prints it as the markdown
table of ``datasets/allreduce/README.md``. The output is deterministic (no
clock), so ``tests/test_cloud_allreduce.py`` checks the shipped file against
a fresh build byte for byte.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "datasets/scripts/derive_cloud_allreduce.py"
OUT = ROOT / "datasets" / "allreduce" / "cloud-derived-model.json"
CATALOG = "datasets/catalog/aws-us-east-1.json"
NOTES = "datasets/allreduce/cloud-sources.md"
DATE = "2026-11-25"  # when these figures were compiled

SOURCES = {
    "aws-bandwidth": "AWS EC2 User Guide, 'Amazon EC2 instance network bandwidth', "
                     "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html "
                     "(also awsdocs/amazon-ec2-user-guide doc_source/ec2-instance-network-bandwidth.md at d289961, "
                     "2023-05-11): single-flow traffic 5 Gbps outside a cluster placement group, up to 10 Gbps "
                     "inside; multi-flow traffic in the Region uses the full instance bandwidth; 'Up to' types have "
                     "a baseline and burst with network I/O credits 'for a limited time, typically from 5 to 60 "
                     "minutes'",
    "aws-accelerated-2022": "AWS EC2 User Guide, 'Accelerated computing instances', network performance table, "
                            "awsdocs/amazon-ec2-user-guide doc_source/accelerated-computing-instances.md at 5bcb1f4 "
                            "(2022-11-05): baseline / burst Gbps p3.2xlarge 2.5 / 10, g3.4xlarge 5 / 10, "
                            "g4dn.xlarge 5 / 25, g4dn.2xlarge 10 / 25, g4dn.4xlarge 20 / 25",
    "aws-accelerated-2023": "same file at d289961 (2023-05-11): g4dn, g5 and p4d baselines (g5.xlarge 2.5 / 10, "
                            "g5.2xlarge 5 / 10, g5.4xlarge 10 / 25; fixed-rate types: baseline = rating)",
    "aws-placement-groups": "awsdocs/amazon-ec2-user-guide doc_source/placement-groups.md at e3707c4 (2023) and "
                            "d1a4d62 (2018-02-02): 5 Gbps single-flow, up to 10 Gbps inside a cluster placement group",
    "aws-efa": "awsdocs/amazon-ec2-user-guide doc_source/efa.md at e3707c4 (2023): EFA-capable types (p3dn, "
               "g4dn.8xlarge and larger, g5.8xlarge and larger, p4d); p4d: 4 network cards, 400 Gbps, GPUDirect "
               "RDMA over EFA",
    "nccl-net-socket": "NVIDIA/nccl src/transport/net_socket.cc, ncclNetSocketGetNsockNthread, identical in tags "
                       "v2.4.8-1 (l.213-215), v2.5.6-1, v2.6.4-1, v2.7.3-1 and HEAD: on an AWS ENA NIC (PCI vendor "
                       "0x1d0f) 2 threads x 8 sockets = 16 TCP connections per peer connection; "
                       "NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD override it (64 sockets at most)",
    "nccl-2.4.8-init": "NVIDIA/nccl v2.4.8-1 src/init.cc l.356-375: latency heuristic ringlatinter = 6 us per ring "
                       "step, treelatinter = 15 us, treelatintra = 4 us",
    "nccl-2.5.6-tuning": "NVIDIA/nccl v2.5.6-1 src/graph/tuning.cc l.60-74: ring/Simple base latency 8.4 us, "
                         "per-hop NET 6.6 us, NVLink and PCI 5.7 us",
    "nccl-398": "NVIDIA/nccl issue 398, 'More ranks, better bus bandwidth?' (2020-10-05..09), "
                "https://github.com/NVIDIA/nccl/issues/398: 2x p3dn.24xlarge, 1 GPU per node, NET/Socket over "
                "ENA, ring, NCCL 2.4.8, 8-256 MB: busbw about 4.7 GB/s, not improved by NCCL_SOCKET_NTHREADS 4 or "
                "6; with 8 GPUs per node busbw is higher (maintainer: more GPUs put more CPU cores and PCIe lanes "
                "to network work); p3dn cudaMemcpy about 90 Gbps per direction pinned, 50 Gbps pageable",
    "aws-network-benchmarks": "cybertronai/aws-network-benchmarks nccltest_output.txt at 95c0bfd (2019): 2x "
                              "p3dn.24xlarge, 8 GPUs per node, EFA, ring, NCCL 2.4.6: 8 B in 146.7 us, 16 KB in "
                              "165.3 us",
    "nccl-527": "NVIDIA/nccl issue 527 (2022-07-25), https://github.com/NVIDIA/nccl/issues/527: p4d.24xlarge "
                "multi-node, EFA, NCCL 2.9.9: 64 B to 16 KB in 164-212 us",
    "nccl-318": "NVIDIA/nccl issue 318 (2020-04), https://github.com/NVIDIA/nccl/issues/318: p3dn.24xlarge, one "
                "node, all_reduce_perf -g 8: 59.98 us at 8 B",
    "pcie-gen3": "PCI-SIG: PCIe Gen3 x16 = 15.75 GB/s (126 Gbit/s) per direction (the catalog's interconnect_gbps "
                 "of PCIe Gen3 types)",
}

# The figures the derived parameters are computed from (each cited in PARAMETERS).
INTRA_8GPU_LATENCY_S = 59.98e-6  # nccl-318: 8 B allreduce on 8 GPUs of one p3dn
PINNED_COPY_GBPS = 90.0  # nccl-398: p3dn cudaMemcpy, pinned, per direction
PCIE3_X16_GBPS = 126.0  # pcie-gen3

PARAMETERS: dict[str, dict[str, Any]] = {
    "devices": {
        "value": ["A10G", "L4", "M60", "T4", "V100"],
        "basis": "published", "sources": ["aws-efa", "aws-accelerated-2023"], "rows": ["1.12", "1.13", "1.20-1.42"],
        "why": "machines of these GPUs (p3, g3, g4dn, g5, g6) reach each other over ENA, where NCCL without the "
               "EFA plugin runs over TCP sockets: the transport every other parameter describes. A100 (p4d) and "
               "H100 (p5) machines talk EFA with GPUDirect RDMA at 400-3200 Gbit/s, which the TCP host cap does "
               "not describe; they go to the fallback",
        "assumption": "NCCL runs over TCP sockets (no aws-ofi-nccl EFA plugin) on EFA-capable types too (p3dn, "
                      "g4dn.8xlarge and larger, g5.8xlarge and larger), as in Srifty's setup (NCCL 2.4.8)",
    },
    "network": {
        "value": "baseline",
        "basis": "published", "sources": ["aws-bandwidth", "aws-accelerated-2022", "aws-accelerated-2023"],
        "rows": ["1.8", "1.20", "1.24", "1.27-1.29", "1.35-1.37"],
        "why": "an 'Up to N Gigabit' type sustains its baseline once its burst credits are spent, 'typically "
               "5 to 60 minutes'; a training job runs longer. The burst rating (network_gbps) bounds the first "
               "minutes (credits are full at launch); fixed-rate types have no baseline field and use their rating",
    },
    "tcp_efficiency": {
        "value": 0.8, "unit": "fraction",
        "basis": "assumed", "rows": ["2.9", "2.12"],
        "why": "eta: the fraction of B_node an NCCL ring over TCP turns into bus bandwidth. No published NCCL "
               "busbw over TCP exists for g3, g4dn or p3 at 25 Gbit/s or less, nor for 10/25 GbE elsewhere in the "
               "sources; 0.8 is a round guess. It is the first parameter to replace by a measurement "
               "(thrifty probe-allreduce); it was not fitted to anything",
        "assumption": "eta = 0.8 for every type",
    },
    "host_cap_gbytes_per_s": {
        "value": 4.7, "unit": "GB/s",
        "basis": "measured", "sources": ["nccl-398"], "rows": ["2.1", "2.2", "2.3", "2.4"],
        "why": "the only published NCCL busbw over TCP on AWS: 2x p3dn.24xlarge (100 Gbit/s), 1 GPU per node, "
               "ring, NCCL 2.4.8 (Srifty's version): about 4.7 GB/s, limited by host-side copies and CPU, not by "
               "the NIC (iperf3 reaches 92 Gbit/s between the same machines)",
        "assumption": "the cap holds for every type and any number of GPUs per machine; more GPUs per machine "
                      "raise it by an amount nobody published (row 2.2), so it is conservative for multi-GPU "
                      "types of 50 Gbit/s and more",
    },
    "per_flow_cap_gbps": {
        "value": 5.0, "unit": "Gbit/s",
        "basis": "published", "sources": ["aws-bandwidth", "aws-placement-groups"], "rows": ["1.1", "1.2", "1.4"],
        "why": "AWS limits one TCP flow to 5 Gbit/s outside a cluster placement group (10 inside). NCCL opens "
               "sockets_per_peer flows per peer, so the flows of one peer may carry 5 x 16 = 80 Gbit/s: above "
               "the baseline of every ENA type up to 50 Gbit/s; for 100 Gbit/s types the host cap binds first. "
               "The cap matters only when NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD is forced down",
        "assumption": "no cluster placement group (the stricter case)",
    },
    "sockets_per_peer": {
        "value": 16, "unit": "TCP connections per peer",
        "basis": "published", "sources": ["nccl-net-socket"], "rows": ["1.50", "1.51"],
        "why": "NCCL's socket transport opens 2 threads x 8 sockets per peer on AWS ENA NICs, from 2.4.8 "
               "(Srifty's) to today",
    },
    "inter_latency_floor_s": {
        "value": 150e-6, "unit": "s",
        "basis": "measured", "sources": ["aws-network-benchmarks", "nccl-527"], "rows": ["2.20", "2.26"],
        "why": "small allreduces across AWS machines take 147-165 us (2x p3dn, 16 ranks, EFA, ring) and 164-212 us "
               "(p4d, EFA): 150 us is the floor of alpha across machines",
        "assumption": "TCP over ENA is no faster than EFA for small messages: no small-message TCP figure on AWS "
                      "was found (row 2.12)",
    },
    "inter_step_latency_s": {
        "value": 6e-6, "unit": "s per ring step",
        "basis": "published", "sources": ["nccl-2.4.8-init", "nccl-2.5.6-tuning"], "rows": ["1.52", "1.53"],
        "why": "NCCL 2.4.8's own ring latency per rank step across machines (2.5.6: 6.6 us per network hop); "
               "alpha across machines is max(floor, 2 (n - 1) x 6 us), so it grows with the ring past 13 workers",
    },
    "intra_step_latency_s": {
        "value": float(f"{INTRA_8GPU_LATENCY_S / (2 * (8 - 1)):.4g}"), "unit": "s per ring step",
        "basis": "derived", "sources": ["nccl-318", "nccl-2.4.8-init"], "rows": ["3.3", "1.52"],
        "why": "59.98 us for an 8 B allreduce on the 8 GPUs of one p3dn, over the 2 (8 - 1) = 14 steps of a ring: "
               "4.28 us per step (NCCL 2.4.8's heuristic inside a machine: 4 us); alpha inside one machine is "
               "2 (n - 1) x that",
        "assumption": "the per-step latency measured on NVLink V100s holds on PCIe GPUs and for 2-4 GPUs",
    },
    "intra_efficiency": {
        "value": float(f"{PINNED_COPY_GBPS / PCIE3_X16_GBPS:.3f}"), "unit": "fraction",
        "basis": "derived", "sources": ["nccl-398", "pcie-gen3"], "rows": ["2.4", "3.9"],
        "why": "pinned host-device copies on p3dn reach about 90 Gbit/s per direction of a 126 Gbit/s PCIe Gen3 "
               "x16 link: 0.714. Inside one machine busbw = 0.714 x interconnect_gbps / 8 (the catalog's "
               "NVLink or PCIe figure per GPU per direction)",
        "assumption": "a ring allreduce over the interconnect reaches the efficiency of a pinned PCIe copy, on "
                      "NVLink too, with GPU peer access: no intra-machine busbw of V100, T4 or M60 machines was "
                      "found (rows 3.4, 3.5, 3.7, 3.8)",
    },
}

MODEL_TEXT = (
    "ring allreduce of s bytes on n workers over N machines: t(s) = alpha + 2 (n-1)/n * s / beta, "
    "busbw(s) = 2 s (n-1) / (n t(s)), b_cap = beta. Across machines (N >= 2): B_node = network_baseline_gbps "
    "if the catalog gives one, else network_gbps; beta = min(tcp_efficiency * min(B_node, per_flow_cap_gbps * "
    "sockets_per_peer) / 8, host_cap), and min(that, beta_intra) with more than one GPU per machine; "
    "alpha = max(inter_latency_floor_s, 2 (n-1) * inter_step_latency_s). Inside one machine (N = 1): "
    "beta = beta_intra = intra_efficiency * interconnect_gbps / 8; alpha = 2 (n-1) * intra_step_latency_s"
)


def parameters() -> dict[str, Any]:
    """`PARAMETERS` in file form: the value first, sources and reasons after."""
    order = ("value", "unit", "basis", "sources", "rows", "why", "assumption")
    return {name: {k: entry[k] for k in order if k in entry} for name, entry in PARAMETERS.items()}


def file_without_table() -> dict[str, Any]:
    return {
        "format": "thrifty.cloud_allreduce_model/1",
        "model": MODEL_TEXT,
        "parameters": parameters(),
        "sources": dict(SOURCES),
        "provenance": {
            "kind": "derived",
            "script": SCRIPT,
            "inputs": [
                f"{NOTES} (research notes of published measurements and documentation; rows cited per parameter)",
                f"{CATALOG} (network_gbps, network_baseline_gbps, gpus, interconnect_gbps: only for the table)",
            ],
            "date": DATE,
            "notes": [
                "Derived, not measured: no allreduce was run for this file. Parameters with basis 'assumed' "
                "(tcp_efficiency) and every 'assumption' are guesses to replace by measurements.",
                "No parameter was fitted or tuned to the Srifty case studies (datasets/examples), which are "
                "the validation of this model.",
                f"Regenerate with: python {SCRIPT}",
            ],
        },
    }


def type_rows(model: Any, catalog: Any) -> list[dict[str, Any]]:
    """What `model` answers for each GPU type of `catalog` (one or two machines, all their GPUs)."""
    from thrifty.perfmodels.allreduce.derived import interconnect_bus_bandwidth, node_network_gbps

    p = model.params
    rows = []
    for t in catalog.types.values():
        if t.device == "cpu":
            continue
        row: dict[str, Any] = {"instance_type": t.name, "device": t.device, "gpus": t.gpus,
                               "network_gbps": t.network_gbps, "network_baseline_gbps": t.network_baseline_gbps}
        if not model.covers(t):
            rows.append({k: v for k, v in row.items() if v is not None} | {"answered_by": "fallback"})
            continue
        b_node = node_network_gbps(t, p.use_baseline)
        limit = p.per_flow_cap_gbps * p.sockets_per_peer
        bounds = {"network": p.tcp_efficiency * min(b_node, limit) * 1e9 / 8, "host cap": p.host_cap_bytes_per_s}
        if t.gpus > 1:
            bounds["interconnect"] = interconnect_bus_bandwidth(t.interconnect_gbps, p)
        bound = min(bounds, key=lambda k: bounds[k])  # the first of equals: network before the host cap
        inter = model.bandwidth_cap(t, 2 * t.gpus, 2)
        row.update(
            answered_by="derived", b_node_gbps=b_node, per_flow_limit_gbps=limit, per_flow_binds=limit < b_node,
            busbw_inter_gbytes_per_s=_round(inter / 1e9), inter_bound_by=bound,
            busbw_intra_gbytes_per_s=_round(model.bandwidth_cap(t, t.gpus, 1) / 1e9) if t.gpus > 1 else None,
            alpha_one_machine_s=_round(model.latency(t, t.gpus, 1), 9) if t.gpus > 1 else None,
            alpha_two_machines_s=_round(model.latency(t, 2 * t.gpus, 2), 9),
        )
        rows.append({k: v for k, v in row.items() if v is not None})
    return rows


def _round(x: float, digits: int = 4) -> float:
    return float(round(x, digits))


def build() -> dict[str, Any]:
    """The model file, checked against (and laid out by) its schema, `CloudAllreduceModelFile`."""
    from thrifty.datasets.catalog import load_catalog
    from thrifty.core.validation import validate_model
    from thrifty.perfmodels.allreduce.derived import CloudAllreduceModelFile, DerivedCloudAllreduce

    model = DerivedCloudAllreduce.from_json(file_without_table(), source=SCRIPT)
    data = {**file_without_table(), "table": type_rows(model, load_catalog(ROOT / CATALOG)), "table_catalog": CATALOG}
    return validate_model(CloudAllreduceModelFile, data, source=SCRIPT, strict=False).to_json()  # built here


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1) + "\n"


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.0f} us"


def _gb(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown_table(data: dict[str, Any]) -> str:
    """The per-type table of ``datasets/allreduce/README.md``."""
    lines = [
        "| type | GPUs | rated / baseline Gbit/s | B_node Gbit/s | busbw across machines GB/s (bound by) "
        "| busbw in one machine GB/s | alpha, one machine | alpha, 2 machines |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["table"]:
        baseline = r.get("network_baseline_gbps")
        rated = f"{r['network_gbps']:g} / {baseline:g}" if baseline is not None else f"{r['network_gbps']:g} / -"
        if r["answered_by"] != "derived":
            lines.append(f"| {r['instance_type']} | {r['gpus']} | {rated} | fallback (analytic ring) | | | | |")
            continue
        lines.append(
            f"| {r['instance_type']} | {r['gpus']} | {rated} | {r['b_node_gbps']:g} | "
            f"{_gb(r['busbw_inter_gbytes_per_s'])} ({r['inter_bound_by']}) | {_gb(r.get('busbw_intra_gbytes_per_s'))} "
            f"| {_us(r.get('alpha_one_machine_s'))} | {_us(r['alpha_two_machines_s'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help="where to write the model file")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if --out differs from a fresh build")
    ap.add_argument("--table", action="store_true", help="print the per-type markdown table only")
    args = ap.parse_args(argv)
    data = build()
    text = render(data)
    if args.table:
        print(markdown_table(data), end="")
        return 0
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date; run: python {SCRIPT}", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    from thrifty.core.io import atomic_write_text

    atomic_write_text(args.out, text)
    print(f"wrote {args.out} ({len(data['table'])} GPU types in the table)")
    print(markdown_table(data), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
