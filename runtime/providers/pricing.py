"""Live EC2 prices from the AWS APIs, and the catalog refresh built on them
(issue 7).

* On-demand: the Price List API, ``pricing.get_products`` for service
  ``AmazonEC2``, filtered (``TERM_MATCH``) by instance type, region code,
  tenancy and operating system. Two more filters are needed for exactly one
  product to match: ``preInstalledSw = NA`` (otherwise the SQL Server bundles
  of the same type match) and ``capacitystatus = Used`` (otherwise the rows
  for unused capacity reservations match). The price is the ``Hrs`` price
  dimension of the product's OnDemand term.
* Spot: ``ec2.describe_spot_price_history`` from now answers the price in
  effect in each availability zone; the run is quoted the price of its zone,
  and a zone-less quote is the median over zones (the shipped catalog's rule
  for its typical spot price).

Spot instances are billed at the spot price of each second; thrifty's cost
accounting charges a machine the price quoted at its launch (a deviation:
the price can move while the machine runs).

`refresh_catalog` writes a new catalog (format ``thrifty.catalog/1``, as
``datasets/catalog/README.md`` describes) with today's prices of every type in
a base catalog, the date and the API each price came from; hardware facts stay
those of the base catalog. ``thrifty catalog refresh`` is its command.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date, datetime, timezone
from typing import Any, Protocol

from thrifty.datasets.catalog import CATALOG_FORMAT, Catalog, parse_catalog_file
from thrifty.core.errors import ProblemError, ProviderError, closest_names
from thrifty.runtime.providers._aws import api_errors

__all__ = [
    "PRICING_REGION",
    "SPOT_PRODUCT",
    "Prices",
    "ApiPrices",
    "CatalogPrices",
    "on_demand_filters",
    "parse_on_demand_price",
    "fetch_on_demand_price",
    "latest_spot_prices",
    "fetch_spot_prices",
    "typical_spot_price",
    "offered_types",
    "refresh_catalog",
    "catalog_types",
]

# The Price List API is served from us-east-1 (and eu-central-1, ap-south-1)
# and answers for every region.
PRICING_REGION = "us-east-1"
SPOT_PRODUCT = "Linux/UNIX"
PRICE_LIST_SOURCE = "aws-price-list"
SPOT_HISTORY_SOURCE = "aws-spot-history"
LOCAL_TYPE = "local"  # the catalog's worker-process type: no AWS price


class Prices(Protocol):
    def price(self, instance_type: str, market: str, zone: str | None = None) -> float:
        """USD per hour of one machine of `instance_type` in `market`
        (in `zone` when given and known)."""


# -- on-demand: the Price List API -------------------------------------------------

def on_demand_filters(instance_type: str, region: str, *, operating_system: str = "Linux",
                      tenancy: str = "Shared") -> list[dict[str, str]]:
    """GetProducts filters that match exactly one EC2 product."""
    fields = {
        "instanceType": instance_type,
        "regionCode": region,
        "tenancy": tenancy,
        "operatingSystem": operating_system,
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def parse_on_demand_price(price_list: Sequence[str], instance_type: str) -> float | None:
    """The hourly USD price in GetProducts' ``PriceList`` (JSON strings, one
    per product); None when no product matched. More than one distinct price
    means the filters were not narrow enough: an error, not a guess."""
    found: dict[float, str] = {}
    for text in price_list:
        item = json.loads(text) if isinstance(text, str) else text
        sku = str(item.get("product", {}).get("sku", "?"))
        for term in item.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if dim.get("unit") == "Hrs" and usd is not None:
                    found.setdefault(float(usd), sku)
    if not found:
        return None
    if len(found) > 1:
        listed = ", ".join(f"${p:g} (sku {s})" for p, s in sorted(found.items()))
        raise ProviderError(f"the Price List API gives {instance_type} several on-demand prices: {listed}")
    return next(iter(found))


def fetch_on_demand_price(pricing: Any, instance_type: str, region: str, *, operating_system: str = "Linux",
                          tenancy: str = "Shared") -> float | None:
    """On-demand USD/hour from ``pricing.get_products``; None if AWS lists no such product.
    Without ``pricing:GetProducts`` permission, ``prices: catalog`` in the
    cluster config avoids this call."""
    filters = on_demand_filters(instance_type, region, operating_system=operating_system, tenancy=tenancy)
    items: list[str] = []
    with api_errors(f"Price List API (get_products for {instance_type} in {region})"):
        for page in pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters):
            items.extend(page.get("PriceList", []))
    return parse_on_demand_price(items, instance_type)


# -- spot: the price history ------------------------------------------------------

def latest_spot_prices(history: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Zone -> the most recent price in SpotPriceHistory records."""
    latest: dict[str, tuple[datetime, float]] = {}
    for rec in history:
        zone, stamp, price = rec["AvailabilityZone"], rec["Timestamp"], float(rec["SpotPrice"])
        if zone not in latest or stamp > latest[zone][0]:
            latest[zone] = (stamp, price)
    return {zone: latest[zone][1] for zone in sorted(latest)}


def fetch_spot_prices(ec2: Any, instance_type: str, now: datetime | None = None) -> dict[str, float]:
    """Zone -> spot USD/hour in effect now (empty when the type has no spot market here)."""
    now = now or datetime.now(timezone.utc)
    records: list[Mapping[str, Any]] = []
    with api_errors(f"describe_spot_price_history for {instance_type}"):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=[instance_type], ProductDescriptions=[SPOT_PRODUCT], StartTime=now)
        for page in pages:
            records.extend(page.get("SpotPriceHistory", []))
    return latest_spot_prices(records)


def typical_spot_price(by_zone: Mapping[str, float]) -> float | None:
    """The median over zones (the catalog's typical spot price)."""
    return float(statistics.median(by_zone.values())) if by_zone else None


def offered_types(ec2: Any, region: str) -> set[str]:
    """Instance types offered in `region` (describe_instance_type_offerings)."""
    names: set[str] = set()
    with api_errors(f"describe_instance_type_offerings in {region}"):
        for page in ec2.get_paginator("describe_instance_type_offerings").paginate(LocationType="region"):
            names.update(o["InstanceType"] for o in page.get("InstanceTypeOfferings", []))
    return names


# -- price books --------------------------------------------------------------------

class ApiPrices:
    """Current prices from the AWS APIs, each kept `ttl_s` seconds.

    `ec2` answers the spot history (in the run's region); `pricing` the Price
    List (a client in `PRICING_REGION`).
    """

    def __init__(self, region: str, ec2: Any, pricing: Any, *, ttl_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic):
        self.region, self.ec2, self.pricing = region, ec2, pricing
        self.ttl_s, self.clock = ttl_s, clock
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}

    def _cached(self, key: tuple[str, str], fetch: Callable[[], Any]) -> Any:
        hit = self._cache.get(key)
        if hit is not None and self.clock() - hit[0] < self.ttl_s:
            return hit[1]
        value = fetch()
        self._cache[key] = (self.clock(), value)
        return value

    def on_demand(self, instance_type: str) -> float:
        price = self._cached(("on_demand", instance_type),
                             lambda: fetch_on_demand_price(self.pricing, instance_type, self.region))
        if price is None:
            raise ProviderError(f"the Price List API has no Linux on-demand price for {instance_type} "
                                f"in {self.region}")
        return price

    def spot_by_zone(self, instance_type: str) -> dict[str, float]:
        return self._cached(("spot", instance_type), lambda: fetch_spot_prices(self.ec2, instance_type))

    def price(self, instance_type: str, market: str, zone: str | None = None) -> float:
        if market == "on_demand":
            return self.on_demand(instance_type)
        if market != "spot":
            raise ProblemError(f"market is '{market}', but must be 'on_demand' or 'spot'")
        by_zone = self.spot_by_zone(instance_type)
        if zone in by_zone:
            return by_zone[zone]
        typical = typical_spot_price(by_zone)
        if typical is None:
            raise ProviderError(f"no spot price history for {instance_type} in {self.region}")
        return typical


class CatalogPrices:
    """Prices from a thrifty catalog (no API calls; the zone is ignored)."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog

    def price(self, instance_type: str, market: str, zone: str | None = None) -> float:
        return self.catalog.get(instance_type).price(market)


# -- thrifty catalog refresh ------------------------------------------------------------

def refresh_catalog(base: Mapping[str, Any], *, region: str, ec2: Any, pricing: Any,
                    types: Sequence[str] | None = None, today: date | None = None,
                    base_source: str = "") -> dict[str, Any]:
    """A new catalog: the rows of `base` with on-demand and spot prices read
    now from the Price List API and the spot price history of `region`.

    A type the APIs do not price keeps the base catalog's prices (when the
    base is for the same region) or gets none (another region), and its row
    says so. `types` limits the refresh to some types (others are left out).
    """
    base = parse_catalog_file(base, base_source).to_json()
    today = today or datetime.now(timezone.utc).date()
    rows = base_rows(base)
    wanted = catalog_types(rows, types, base_source)
    offered = offered_types(ec2, region)
    same_region = base.get("region") == region
    new_rows = []
    for name in wanted:
        if name == LOCAL_TYPE:
            new_rows.append(dict(rows[name]))
            continue
        od = fetch_on_demand_price(pricing, name, region)
        spot = fetch_spot_prices(ec2, name)
        new_rows.append(_refreshed_row(rows[name], od, spot, name in offered, same_region, region, today))
    catalog = {
        "format": CATALOG_FORMAT,
        "provider": "aws",
        "region": region,
        "provenance": _refresh_provenance(base, base_source, region, today),
        "instance_types": new_rows,
    }
    return parse_catalog_file(catalog, f"the refreshed catalog of {region}").to_json()  # one the solver loads


def base_rows(base: Mapping[str, Any]) -> dict[str, Any]:
    return {row["name"]: row for row in base.get("instance_types", [])}


def catalog_types(rows: Mapping[str, Any], types: Sequence[str] | None, source: str = "") -> list[str]:
    """The types to price: all of `rows` (name -> row), or `types`, each of
    which must be one of them (an unknown name lists the closest)."""
    if types is None:
        return list(rows)
    for name in types:
        if name not in rows:
            close = closest_names(name, rows)
            hint = f"; closest known: {', '.join(close)}" if close else ""
            raise ProblemError(f"unknown instance type '{name}' in the base catalog {source}{hint}")
    return list(dict.fromkeys(types))


def _refreshed_row(row: Mapping[str, Any], on_demand: float | None, spot_by_zone: Mapping[str, float],
                   offered: bool, same_region: bool, region: str, today: date) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k not in ("notes", "spot_usd_per_hour_srifty2022")}
    notes = [f"hardware facts from the base catalog; prices read from the AWS APIs on {today.isoformat()}"]
    out["offered_in_region"] = offered
    if on_demand is not None:
        out["on_demand_usd_per_hour"] = on_demand
        out["on_demand_price_source"] = PRICE_LIST_SOURCE
        out["price_date"] = today.isoformat()
        od_text = f"AWS Price List API get_products ({region}, Linux, shared tenancy) on {today.isoformat()}"
    else:
        od_text = _unpriced(out, "on_demand_usd_per_hour", "price_date", "on-demand", same_region, notes)
    spot = typical_spot_price(spot_by_zone)
    if spot is not None:
        out["spot_usd_per_hour"] = round(spot, 6)
        out["spot_observations_usd_per_hour"] = dict(spot_by_zone)
        out["spot_price_source"] = SPOT_HISTORY_SOURCE
        out["spot_price_date"] = today.isoformat()
        spot_text = (f"spot = median of {len(spot_by_zone)} {region} zone prices from EC2 "
                     f"describe_spot_price_history ({SPOT_PRODUCT}) on {today.isoformat()}")
    else:
        out.pop("spot_observations_usd_per_hour", None)
        spot_text = "spot: " + _unpriced(out, "spot_usd_per_hour", "spot_price_date", "spot", same_region, notes)
    out["price_source"] = f"{od_text}; {spot_text}"
    out["notes"] = notes
    return out


def _unpriced(row: dict[str, Any], field: str, date_field: str, market: str, same_region: bool,
              notes: list[str]) -> str:
    """Keep the base price (same region) or drop it and its date (another region); say which."""
    if same_region and row.get(field) is not None:
        notes.append(f"the AWS APIs gave no {market} price; the base catalog's price is kept")
        return f"base catalog ({row.get('price_source', 'unknown source')})"
    row[field] = None
    row[date_field] = None
    notes.append(f"the AWS APIs gave no {market} price in this region")
    return f"no {market} price"


def _refresh_provenance(base: Mapping[str, Any], base_source: str, region: str, today: date) -> dict[str, Any]:
    base_prov = base.get("provenance", {})
    sources = dict(base_prov.get("sources", {}))
    sources[PRICE_LIST_SOURCE] = (f"AWS Price List API (pricing.get_products, service AmazonEC2, region code "
                                  f"{region}, Linux, shared tenancy, no pre-installed software, "
                                  f"capacitystatus Used), read on {today.isoformat()}")
    sources[SPOT_HISTORY_SOURCE] = (f"EC2 describe_spot_price_history in {region} ({SPOT_PRODUCT}), the price in "
                                    f"effect per availability zone on {today.isoformat()}")
    return {
        "kind": "published",
        "script": "thrifty catalog refresh",
        "date": today.isoformat(),
        "region": region,
        "inputs": [
            f"base catalog {base_source or '(given)'} (hardware facts; provenance date "
            f"{base_prov.get('date', 'unknown')})",
            "AWS Price List API get_products (on-demand prices)",
            "EC2 describe_spot_price_history (spot prices), describe_instance_type_offerings (offered_in_region)",
        ],
        "sources": sources,
        "notes": [
            "Regenerate with: thrifty catalog refresh --region " + region,
            "Prices are USD per hour, Linux. spot_usd_per_hour is the median over availability zones of the "
            "spot price in effect on the date; spot prices move by zone and over time.",
            "Rows the APIs did not price say so in notes and price_source.",
        ],
    }
