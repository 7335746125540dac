"""Where a checkpoint lives, for every machine of a run: a location string,
a local path or an ``s3://bucket/key`` URL, and the few operations a
checkpoint needs on it (`exists`, `read_bytes`, `write_bytes_atomic`,
`delete`, `describe` for messages), and `join` for the locations under a
folder (a tuning run's trials each checkpoint under the run's storage).

A local path serves one host, or many that share a file system; an S3
object serves machines anywhere (a Ray cluster, EC2 instances).

Writes are atomic on both, so a reader, or a restarted run, sees the
previous checkpoint or the new one, never a torn one, and a failed write
never loses the last good one:

- a local path: a temporary file in the same folder, fsync, `os.replace`,
  then an fsync of the folder, which makes the rename itself durable;
- S3: one ``PutObject``. S3 makes an object visible only once its whole
  upload has arrived and been stored, and then atomically: readers get the
  previous object until then (S3 is strongly read-after-write consistent),
  and an upload that fails or is cut off halfway leaves no object, so the
  previous one stays. botocore 1.36 and later also send a CRC checksum
  that S3 checks, and check it again on download. One PUT takes at most
  5 GB.

boto3 (the ``aws`` extra) is imported on the first use of an ``s3://``
location, never for a local path. Each process makes one S3 client
(`s3_client`) and keeps it; a forked child or a changed AWS environment
gets a new one. The client is configured as any boto3 client is: region,
credentials and profile from the environment and the shared AWS config
files, and the endpoint from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``
(read by botocore itself: an S3-compatible store, or a moto server in
tests). Throttled and transient calls are retried (botocore's standard mode).

Errors: a location that is neither a path nor an ``s3://bucket/key`` URL is
bad input (`ProblemError`). A failed S3 call is a `ProviderError` naming the
location and the AWS error code (``NoSuchBucket``, ``AccessDenied``, ...):
the cloud failed or refused, as when it refuses an EC2 launch, while the
input itself was well formed (exit 1, a backend failure, not 2). Without
``s3:ListBucket`` S3 answers ``AccessDenied`` for an object that does not
exist, rather than saying it is absent.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrifty.core.errors import ProblemError, ProviderError
from thrifty.core.io import atomic_write_bytes
from thrifty.runtime.providers._aws import api_errors, boto3_module, error_code, make_client

__all__ = ["Location", "S3Object", "parse", "parse_folder", "join", "is_remote", "is_remote_folder", "describe",
           "exists", "read_bytes", "write_bytes_atomic", "delete", "s3_client"]

Location = str | os.PathLike[str]

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_ABSENT = ("404", "NoSuchKey", "NotFound")  # HeadObject answers a bare 404: a HEAD reply has no body
# what configures a client; a change makes `s3_client` build a new one
_CLIENT_ENV = ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
               "AWS_ACCESS_KEY_ID", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
_clients: dict[tuple[int, tuple[str | None, ...]], Any] = {}
_clients_lock = threading.Lock()


@dataclass(frozen=True)
class S3Object:
    """One object of S3: ``s3://bucket/key``."""

    bucket: str
    key: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def parse(location: Location) -> Path | S3Object:
    """What `location` names: a local `Path`, or an `S3Object` for
    ``s3://bucket/key``. A `ProblemError` for an empty location, another
    URL scheme, or an S3 URL without its bucket or key."""
    where = _split(location, "a path or an s3://bucket/key URL")
    if isinstance(where, S3Object) and (not where.bucket or not where.key or where.key.endswith("/")):
        raise ProblemError(f"is '{location}', but an S3 location must name a bucket and an object key "
                           "(s3://bucket/folder/checkpoint.pt)")
    return where


def parse_folder(location: Location) -> Path | S3Object:
    """What the folder `location` names: a local `Path`, or an `S3Object`
    whose key is the prefix (empty for a whole bucket) for ``s3://bucket``
    or ``s3://bucket/prefix``. A `ProblemError` for an empty location,
    another URL scheme, or an S3 URL without its bucket."""
    where = _split(location, "a folder or an s3://bucket/prefix URL")
    if isinstance(where, S3Object):
        if not where.bucket:
            raise ProblemError(f"is '{location}', but an S3 location must name a bucket (s3://bucket/prefix)")
        return S3Object(where.bucket, where.key.strip("/"))
    return where


def _split(location: Location, wanted: str) -> Path | S3Object:
    """A path, or an ``s3://`` URL's bucket and the rest, unchecked; a
    `ProblemError` saying `wanted` for an empty location or another scheme."""
    if isinstance(location, os.PathLike):
        return Path(location)
    if not location:
        raise ProblemError(f"is empty, but must be {wanted}")
    url = _URL.match(location)
    if url is None:
        return Path(location)
    scheme, rest = url.groups()
    if scheme.lower() != "s3":
        raise ProblemError(f"is '{location}', but must be {wanted} ('{scheme}://' is not supported)")
    bucket, _, key = rest.partition("/")
    return S3Object(bucket, key)


def join(folder: Location, *parts: str) -> str:
    """The location of `parts` under `folder` (a local folder, or
    ``s3://bucket[/prefix]``): a path, or an ``s3://`` URL; `ProblemError`
    for a folder `parse_folder` refuses."""
    where = parse_folder(folder)
    if isinstance(where, Path):
        return str(where.joinpath(*parts))
    key = "/".join(p.strip("/") for p in (where.key, *parts) if p.strip("/"))
    return str(S3Object(where.bucket, key))


def is_remote_folder(folder: Location) -> bool:
    """Is the folder `folder` on S3 (not a local path)?"""
    return isinstance(parse_folder(folder), S3Object)


def is_remote(location: Location) -> bool:
    """Is `location` an S3 object (not a local path)?"""
    return isinstance(parse(location), S3Object)


def describe(location: Location) -> str:
    """`location` as messages name it."""
    return str(parse(location))


def exists(location: Location) -> bool:
    """Is there something at `location`? (A missing bucket is an error, not
    an absent object.)"""
    where = parse(location)
    if isinstance(where, Path):
        return where.exists()
    client = s3_client()
    from botocore.exceptions import ClientError

    with api_errors(f"checking {where}"):
        try:
            client.head_object(Bucket=where.bucket, Key=where.key)
            return True
        except ClientError as e:
            if error_code(e) not in _ABSENT:
                raise
        try:
            client.head_bucket(Bucket=where.bucket)
        except ClientError as e:
            if error_code(e) in _ABSENT:
                raise ProviderError(f"checking {where} failed: NoSuchBucket: the bucket '{where.bucket}' does "
                                    "not exist") from e
            raise
    return False


def read_bytes(location: Location) -> bytes | None:
    """The bytes at `location`, or None when there is nothing there."""
    where = parse(location)
    if isinstance(where, Path):
        try:
            return where.read_bytes()
        except FileNotFoundError:
            return None
    client = s3_client()
    from botocore.exceptions import ClientError

    with api_errors(f"reading {where}"):
        try:
            reply = client.get_object(Bucket=where.bucket, Key=where.key)
        except ClientError as e:
            if error_code(e) in _ABSENT:
                return None
            raise
        data: bytes = reply["Body"].read()
    return data


def write_bytes_atomic(location: Location, data: bytes) -> None:
    """Write `data` to `location` so that readers see the previous bytes or
    these, never part of them (the module docstring says how)."""
    where = parse(location)
    if isinstance(where, Path):
        atomic_write_bytes(where, data)
        _fsync_folder(where.parent)
        return
    with api_errors(f"writing {where}"):
        s3_client().put_object(Bucket=where.bucket, Key=where.key, Body=data)


def delete(location: Location) -> None:
    """Remove what is at `location`; nothing there is not an error."""
    where = parse(location)
    if isinstance(where, Path):
        where.unlink(missing_ok=True)
        return
    with api_errors(f"deleting {where}"):
        s3_client().delete_object(Bucket=where.bucket, Key=where.key)


def s3_client() -> Any:
    """This process's S3 client, made on first use (and again after a fork or
    a change of the AWS environment variables that configure it)."""
    key = (os.getpid(), tuple(os.environ.get(name) for name in _CLIENT_ENV))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            session = boto3_module().session.Session()
            # no region is fine: botocore then uses us-east-1 and follows S3's redirect to the bucket's region
            client = _clients[key] = make_client(session, "s3", region=session.region_name)
    return client


def _fsync_folder(folder: Path) -> None:
    # the rename itself is durable only once the folder entry is on disk
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
