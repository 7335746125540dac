"""The cluster config file of the ``ec2`` provider (issue 7).

A YAML or JSON file that says where machines are started and what runs on a
new one::

    provider: ec2
    region: us-east-1
    ami: ami-0123456789abcdef0        # a Deep Learning AMI, say
    subnet: subnet-0abc1234           # optional: default VPC otherwise
    security_groups: [sg-0abc1234]    # optional
    key_name: thrifty                 # optional: an EC2 key pair for ssh
    iam_instance_profile: thrifty-worker   # optional: name or ARN
    setup_commands:                   # run once as root on every new machine
      - pip install 'thrifty[torch]'

Optional: ``ssh_user`` (default ``ubuntu``), ``tags`` (added to every
instance), ``availability_zone`` (the zone whose spot price the run is quoted;
default: the median over zones), ``use_public_ip`` (workers address machines
by public IP; default private), ``spot_max_price_usd`` (per hour; default:
AWS's cap, the on-demand price), ``launch_timeout_s`` (default 600),
``poll_interval_s`` (how often the driver calls ``describe_instances``,
default 5), ``imds_interval_s`` (how often a machine asks its metadata
service for a spot notice, default 5), ``prices`` (``api``: the AWS Price
List and spot price history, the default; ``catalog``: the thrifty catalog
named by ``catalog``, for accounts without ``pricing:GetProducts``), and
``retries`` (botocore's retry configuration, ``{mode: standard|adaptive,
max_attempts: 8}``).

The setup commands become the instance's user data: a bash script that
cloud-init runs once as root on first boot (`user_data`). When the machines
join a Ray cluster (the ``ray`` launcher), the user data is instead
`thrifty.runtime.cluster.bootstrap.join_script`: the setup commands, then
thrifty's installation, then ``thrifty node join``. For that:

* ``install``: how thrifty gets onto a machine: ``version`` (the default:
  ``pip install 'thrifty[ray,torch]==<the driver's version>'``), a wheel (an
  absolute path on the machine, or an http(s) URL, ending in ``.whl``:
  installed with the same extras), or ``none`` (the AMI has it);
* ``head_address``: where the machines find the Ray head, ``host:port``
  (default: the driver fills in its own address and ``ray_port``);
* ``head_ip``: the address the head the driver starts binds to (default:
  the driver's own address toward the machines, as Ray picks it);
* ``ray_port``: the GCS port of the head the driver starts (default 6379);
* ``join_timeout_s``: how long the driver waits for a running machine's node
  to join the cluster (default 600).

Every error names the JSON path of the bad field, as problem files do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from thrifty.core.errors import ProblemError
from thrifty.core.io import read_document
from thrifty.core.validation import validate_model
from thrifty.runtime.providers.addresses import check_ip, parse_address

__all__ = ["ClusterConfig", "RetryConfig", "load_cluster_config", "parse_cluster_config", "user_data"]

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
RESERVED_TAG_PREFIXES = ("aws:", "thrifty:")
INSTALL_CHOICES = ("version", "none")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RetryConfig(_Frozen):
    """botocore's retry configuration: throttled and transient errors are
    retried with exponential backoff (``adaptive`` also rate-limits the
    client). `max_attempts` counts the first try (1 = no retry), as
    ``AWS_MAX_ATTEMPTS`` does."""

    mode: Literal["standard", "adaptive", "legacy"] = "standard"
    max_attempts: Annotated[int, Field(ge=1, le=50)] = 8


class ClusterConfig(_Frozen):
    provider: Literal["ec2"] = "ec2"
    region: Annotated[str, Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$")]
    ami: Annotated[str, Field(pattern=r"^ami-[0-9a-f]{8,17}$")]
    subnet: Annotated[str, Field(pattern=r"^subnet-[0-9a-f]{8,17}$")] | None = None
    security_groups: list[Annotated[str, Field(pattern=r"^sg-[0-9a-f]{8,17}$")]] = []
    key_name: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    iam_instance_profile: Annotated[str, Field(min_length=1)] | None = None
    setup_commands: list[Annotated[str, Field(min_length=1)]] = []
    ssh_user: Annotated[str, Field(min_length=1)] = "ubuntu"
    tags: dict[Annotated[str, Field(min_length=1, max_length=128)], Annotated[str, Field(max_length=256)]] = {}
    availability_zone: Annotated[str, Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d+[a-z]$")] | None = None
    use_public_ip: bool = False
    spot_max_price_usd: PositiveFloat | None = None
    launch_timeout_s: PositiveFloat = 600.0
    poll_interval_s: PositiveFloat = 5.0
    imds_interval_s: PositiveFloat = 5.0
    prices: Literal["api", "catalog"] = "api"
    catalog: str | None = None
    retries: RetryConfig = RetryConfig()
    install: Annotated[str, Field(min_length=1)] = "version"
    head_address: str | None = None
    head_ip: str | None = None
    ray_port: Annotated[int, Field(ge=1, le=65535)] = 6379
    join_timeout_s: PositiveFloat = 600.0

    @field_validator("install")
    @classmethod
    def _install_is_known(cls, install: str) -> str:
        if install in INSTALL_CHOICES:
            return install
        url = urlsplit(install)
        local = url.scheme == "" and install.startswith("/")
        if not (local or url.scheme in ("http", "https", "file")) or not url.path.endswith(".whl"):
            raise ValueError(f"install is '{install}', but must be 'version', 'none', or a wheel: an absolute path "
                             "or an http(s) or file URL ending in .whl")
        return install

    @field_validator("head_address")
    @classmethod
    def _head_address_is_host_port(cls, address: str | None) -> str | None:
        if address is not None:
            parse_address(address)  # ValueError (a ProblemError) naming the rule
        return address

    @field_validator("head_ip")
    @classmethod
    def _head_ip_is_an_address(cls, ip: str | None) -> str | None:
        if ip is not None:
            check_ip(ip)
        return ip

    @field_validator("tags")
    @classmethod
    def _own_tags_reserved(cls, tags: dict[str, str]) -> dict[str, str]:
        for key in tags:
            if key.lower().startswith(RESERVED_TAG_PREFIXES):
                raise ValueError(f"tag key '{key}' is reserved ('aws:' belongs to AWS, 'thrifty:' to thrifty)")
        return tags

    @property
    def iam_profile_spec(self) -> dict[str, str] | None:
        """``IamInstanceProfile`` for run_instances: an ARN or a name."""
        if self.iam_instance_profile is None:
            return None
        key = "Arn" if self.iam_instance_profile.startswith("arn:") else "Name"
        return {key: self.iam_instance_profile}


def user_data(config: ClusterConfig) -> str | None:
    """The setup commands as a bash script for cloud-init (run once, as root,
    stopping at the first failing command); None when there are none."""
    if not config.setup_commands:
        return None
    return "#!/bin/bash\nset -euxo pipefail\n" + "\n".join(config.setup_commands) + "\n"


def parse_cluster_config(data: Any, source: str | None = None) -> ClusterConfig:
    if not isinstance(data, dict):
        raise ProblemError(f"a cluster config must be a mapping, not {type(data).__name__}", source=source)
    return validate_model(ClusterConfig, data, source=source)


def load_cluster_config(path: str | Path) -> ClusterConfig:
    """Load a ``.yaml``/``.yml`` or ``.json`` cluster config file."""
    path = Path(path)
    data = read_document(path)  # YAML for .yaml/.yml, else JSON
    config = parse_cluster_config(data, source=str(path))
    if config.catalog is not None and not Path(config.catalog).is_absolute():
        config = config.model_copy(update={"catalog": str(path.parent / config.catalog)})
    return config
