"""What ``--cluster`` names, and the provider that gives its machines.

- ``local`` (or nothing): `LocalProvider`, worker slots on this host, forked
  by the local launcher; no Ray.
- ``auto``: the Ray cluster running on this host (``ray start --head``);
  ``HOST:PORT``: the Ray cluster whose head (GCS) is there; ``ray://HOST:PORT``:
  through Ray Client. Its nodes must carry the plan's instance types as
  resources (`thrifty.runtime.cluster.resources`); `RayProvider.check_plan`
  says before the run what is missing.
- a cluster config file (``.yaml``, ``.yml``, ``.json``): machines its
  provider starts, which join a Ray cluster (see ``docs/ec2.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from thrifty.datasets.catalog import Catalog
from thrifty.core.errors import ProblemError
from thrifty.runtime.providers.base import Provider

__all__ = ["cluster_kind", "cluster_provider", "driver_log_path"]

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def cluster_kind(cluster: str | Path | None) -> Literal["local", "ray", "config"]:
    """Which kind of cluster `cluster` names; `ProblemError` (path ``cluster``) when none."""
    if cluster is None or str(cluster) == "local":
        return "local"
    text = str(cluster)
    if text.endswith(CONFIG_SUFFIXES):
        if not Path(text).exists():
            raise ProblemError(f"cluster config file {text} does not exist", path="cluster")
        return "config"
    if text == "auto" or text.startswith("ray://"):
        return "ray"
    host, sep, port = text.rpartition(":")
    if sep and host and port.isdigit() and 0 < int(port) < 65536:
        return "ray"
    raise ProblemError(f"is '{text}', but must be 'local', 'auto', 'HOST:PORT', 'ray://HOST:PORT' or a cluster "
                       "config file (.yaml, .yml, .json)", path="cluster")


def cluster_provider(cluster: str | Path | None, run_id: str, catalog: Catalog,
                     preload: Sequence[str] = (), *, run_folder: Path | None = None) -> Provider:
    """The provider of the machines of `cluster` for run `run_id`; on a Ray
    cluster, what Ray and torch print in this process goes to
    `driver_log_path(run_folder)` (given a `run_folder`), not to the terminal."""
    kind = cluster_kind(cluster)
    if kind == "local":
        from thrifty.runtime.providers.local import LocalProvider

        return LocalProvider(run_id, catalog)
    log_path = driver_log_path(run_folder) if run_folder is not None else None
    if kind == "ray":
        from thrifty.runtime.cluster.provider import RayProvider

        return RayProvider(run_id, catalog, str(cluster), preload=preload, log_path=log_path)
    return config_provider(Path(str(cluster)), run_id, catalog, preload, log_path=log_path)


def driver_log_path(run_folder: Path) -> Path:
    """Where a run's driver keeps what Ray and torch print in it: ``RUN_FOLDER/logs/driver.log``."""
    return Path(run_folder) / "logs" / "driver.log"


def config_provider(path: Path, run_id: str, catalog: Catalog, preload: Sequence[str] = (), *,
                    log_path: Path | None = None) -> Provider:
    """The machines of a cluster config (``provider: ec2``), as nodes of a Ray
    cluster: a head this driver starts on ``head_ip:ray_port`` (or the one at
    ``head_address``), instances whose user data joins it, and a
    `RayProvider` over them that waits for each to join
    (``join_timeout_s``). Closing the provider terminates the instances, then
    stops the head."""
    from thrifty.runtime.cluster.bootstrap import join_script
    from thrifty.runtime.cluster.head import RayHead, default_head_ip
    from thrifty.runtime.cluster.provider import RayProvider
    from thrifty.runtime.providers.config import load_cluster_config
    from thrifty.runtime.providers.ec2 import Ec2Provider

    config = load_cluster_config(path)
    head, address = None, config.head_address
    if address is None:
        head = RayHead(config.head_ip or default_head_ip(), config.ray_port)
        address = head.start()
    source = None
    try:
        script = join_script(config, address, env=head.auth_env if head is not None else None)
        source = Ec2Provider(run_id, config, user_data=script)
        return RayProvider(run_id, catalog, address, source=source, join_timeout_s=config.join_timeout_s,
                           imds_interval_s=config.imds_interval_s, preload=preload, head=head, log_path=log_path)
    except BaseException:
        if source is not None:
            source.close()
        if head is not None:
            head.stop()
        raise
