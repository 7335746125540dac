"""Machine providers: where the runtime gets machines and gives them back.

`local` (worker processes on this host) is the default everywhere; `ec2`
(boto3, the `aws` extra) rents EC2 instances; `virtual` starts machines on a
clock with the cloud's drawn latencies (the simulated side of a tuning plan). All
implement `thrifty.runtime.providers.base.Provider`.
"""

from thrifty.runtime.providers.base import CapacityError, Machine, Provider, billed_cost_usd

__all__ = ["CapacityError", "Machine", "Provider", "billed_cost_usd"]
