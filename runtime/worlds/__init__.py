"""Worker worlds: the one way thrifty starts groups of worker processes.

Training worlds, tuning trials, the profiler's co-located and DDP-overhead
workers, the scaling profiler and the allreduce probe all start their ranks
here, with one contract: start N ranks around a rendezvous store this process
hosts (`World`), stream their events in one protocol (`RankChannel` on the
rank's side), bound every wait with a timeout, have every rank die with its
starter, and reap every process. Where the ranks run is the launcher's
business (`Launcher`): the local one, the default, is the fork server
(`zygote`: torch imported once, each rank a fork); the Ray launcher
(`thrifty.runtime.cluster`) runs them on the machines of a Ray cluster.

This package also holds what the runtime and the measurement tools share
without the runtime importing measurement: `resolve_factory`
(``module:function`` names), `loopback_interface` and `resolve_backend`. It is
the one part of `thrifty.runtime.measure` the runtime imports (besides the
measurement tools' public entry points that its CLI commands call).

Importing this package imports no torch; starting a world does.
"""

from thrifty.runtime.worlds.errors import WorldFailed
from thrifty.runtime.worlds.factory import resolve_factory
from thrifty.runtime.worlds.launcher import Launcher, LocalLauncher, RankProcess, write_files
from thrifty.runtime.worlds.network import interface_of, loopback_interface, resolve_backend
from thrifty.runtime.worlds.rank import RankChannel, configure_logging, join_world, leave, serve_rank
from thrifty.runtime.worlds.rank import world_barrier
from thrifty.runtime.worlds.world import World
from thrifty.runtime.worlds.zygote import die_with_parent, start_zygote, zygote

__all__ = ["World", "WorldFailed", "Launcher", "LocalLauncher", "RankProcess", "write_files", "interface_of",
           "RankChannel", "serve_rank", "configure_logging", "join_world", "leave",
           "world_barrier", "zygote", "start_zygote", "die_with_parent", "resolve_factory",
           "loopback_interface", "resolve_backend"]
