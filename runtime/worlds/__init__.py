"""Worker worlds: the one way thrifty starts groups of worker processes.

Training worlds, tuning trials, the profiler's co-located and DDP-overhead
workers, the scaling profiler and the allreduce probe all start their ranks
here, with one contract: start N ranks around a rendezvous store this process
hosts (`World`), stream their events in one protocol (`RankChannel` on the
rank's side), bound every wait with a timeout, have every rank die with its
starter, reap every process, and watch them with one watcher (`Watch`), whose
looks end in a typed outcome (`Finished`, `Failed`, `Lost`, `Killed`,
`ServerGone`, `Stalled`). Where the ranks run is the launcher's business
(`Launcher`, a typed Protocol): the local one, the default, is the fork
server (`zygote`: torch imported once, each rank a fork); the Ray launcher
(`ray`: the driver's `RayLauncher` and the node's `NodeRanks`) runs them on
the machines of a Ray cluster.

This package also holds what the runtime and the measurement tools share:
`resolve_factory` (``module:function`` names), `loopback_interface`,
`resolve_backend`, and the allocator policy every worker runs under. It sits
below everything in the runtime that starts processes and imports none of it.

Importing this package imports no torch and no Ray; starting a world does.
"""

from thrifty.runtime.worlds.errors import WorldFailed
from thrifty.runtime.worlds.factory import resolve_factory
from thrifty.runtime.worlds.launcher import Launcher, LocalLauncher, RankProcess
from thrifty.runtime.worlds.ray import RayLauncher
from thrifty.runtime.worlds.network import interface_of, loopback_interface, resolve_backend
from thrifty.runtime.worlds.rank import CommandWatch, RankChannel, configure_logging, join_world, leave, serve_rank
from thrifty.runtime.worlds.rank import leave_group, world_barrier
from thrifty.runtime.worlds.watch import Failed, Finished, Killed, Look, Lost, Outcome, ServerGone, Stalled, Watch
from thrifty.runtime.worlds.world import World
from thrifty.runtime.worlds.zygote import die_with_parent, start_zygote, zygote

__all__ = ["World", "WorldFailed", "Launcher", "LocalLauncher", "RayLauncher", "RankProcess", "interface_of",
           "RankChannel", "CommandWatch", "serve_rank", "configure_logging", "join_world", "leave",
           "world_barrier", "leave_group", "zygote", "start_zygote", "die_with_parent", "resolve_factory",
           "loopback_interface", "resolve_backend", "Watch", "Look", "Outcome", "Finished", "Failed", "Lost",
           "Killed", "ServerGone", "Stalled"]
