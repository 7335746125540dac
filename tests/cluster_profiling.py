"""What the tests of ``thrifty profile --cluster`` and ``thrifty profile-scaling
--cluster`` check on every cluster (a Ray cluster on 127.0.0.1, EC2 on moto):
the provider the command made gave every machine back, and the cost it
reports is the machines' seconds at the catalog's price."""

from __future__ import annotations

import pytest


def assert_gave_everything_back(provider, types: dict[str, int]) -> None:
    """The provider holds no machine, and took `types[t]` machines of each type t, each given back."""
    assert provider.machines() == []
    held = provider.all_machines()
    assert {t: sum(m.instance_type == t for m in held) for t in types} == types and len(held) == sum(types.values())
    assert all(m.terminated_at is not None and m.terminated_at >= m.launched_at for m in held)


def assert_costs(bundle, costs: dict[str, float], out: str) -> None:
    """Every type's cost is its machine-seconds at the catalog price, the total their sum, and both printed."""
    for name, record in bundle.machines.items():
        assert record.usd_per_hour == costs[name]
        assert record.cost_usd == pytest.approx(record.machine_s * costs[name] / 3600, rel=1e-3, abs=1e-6)
        assert record.launch_to_ready_s == pytest.approx(record.scale_latency_s + record.init_latency_s, abs=1e-3)
        assert record.init_latency_s > 0 and record.machine_s >= record.launch_to_ready_s
    assert bundle.total_cost_usd == pytest.approx(sum(r.cost_usd for r in bundle.machines.values()), abs=1e-5)
    assert f"total cost ${bundle.total_cost_usd:.6f}" in " ".join(out.split())
