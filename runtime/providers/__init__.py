"""Machine providers: where the runtime gets machines and gives them back.

`local` (worker processes on this host) is the default everywhere; `ec2`
(boto3, the `aws` extra) rents EC2 instances; `virtual` starts machines on a
clock with the cloud's drawn latencies (the simulated side of a tuning plan). All
implement `thrifty.runtime.providers.base.Provider`. The names below import
lazily: the command line's parser reads `addresses` for every command, and
must not load the catalog's schema and the provider base to do so.
"""

from __future__ import annotations

from thrifty.core.optional import lazy_exports

_EXPORTS = {"CapacityError": "base", "Machine": "base", "Provider": "base", "billed_cost_usd": "base"}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("thrifty.runtime.providers", _EXPORTS)
