"""What every AWS caller in thrifty shares: the lazy boto3 import, sessions and
clients with botocore's retry configuration, the credentials check that runs
before anything is spent, and botocore errors turned into `ProviderError`.

boto3 is the ``aws`` extra; nothing imports it until a command needs AWS.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from thrifty.core.errors import ProblemError, ProviderError
from thrifty.core.optional import require

__all__ = ["boto3_module", "make_session", "make_client", "verify_credentials", "api_errors", "error_code",
           "error_message", "is_botocore_error", "CredentialsError"]


class CredentialsError(ProviderError):
    """No usable AWS credentials; raised before any machine is started."""


def boto3_module() -> Any:
    return require("boto3", "aws")


def make_session(profile: str | None = None, region: str | None = None) -> Any:
    """A boto3 session; the region from the argument, else the profile or
    ``AWS_DEFAULT_REGION``. A missing region is bad input (exit 2)."""
    boto3 = boto3_module()
    from botocore.exceptions import ProfileNotFound

    try:
        session = boto3.session.Session(profile_name=profile, region_name=region)
    except ProfileNotFound as e:
        raise ProblemError(f"AWS profile '{profile}' is not configured ({e})") from None
    if not session.region_name:
        raise ProblemError("no AWS region: pass --region, set region in the cluster config, or set "
                           "AWS_DEFAULT_REGION")
    return session


def make_client(session: Any, service: str, *, region: str | None, retry_mode: str = "standard",
                max_attempts: int = 8, endpoint_url: str | None = None) -> Any:
    """A client whose throttled and transient calls botocore retries with
    exponential backoff (``standard``) or also rate-limits (``adaptive``)."""
    from botocore.config import Config

    # total_max_attempts counts the first try, as AWS_MAX_ATTEMPTS does (botocore's max_attempts does not).
    config = Config(region_name=region, retries={"mode": retry_mode, "total_max_attempts": max_attempts},
                    connect_timeout=10, read_timeout=60)
    return session.client(service, config=config, endpoint_url=endpoint_url)


def verify_credentials(sts: Any) -> dict[str, str]:
    """Who the credentials belong to (``sts.get_caller_identity``); a clear
    `CredentialsError` when there are none or AWS rejects them."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

    try:
        ident = sts.get_caller_identity()
    except (NoCredentialsError, PartialCredentialsError) as e:
        raise CredentialsError(
            f"no usable AWS credentials ({e}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, "
            "or run `aws configure`. Nothing was started.") from None
    except ClientError as e:
        raise CredentialsError(f"AWS rejected the credentials ({error_code(e)}: "
                               f"{e.response.get('Error', {}).get('Message', e)}). Nothing was started.") from None
    except BotoCoreError as e:
        raise CredentialsError(f"could not check the AWS credentials: {e}. Nothing was started.") from None
    return {"account": str(ident.get("Account", "")), "arn": str(ident.get("Arn", ""))}


def error_code(error: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError`` (None for others)."""
    response = getattr(error, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


def error_message(error: BaseException) -> str:
    """The AWS error message of a botocore ``ClientError`` ('' for others)."""
    response = getattr(error, "response", None)
    return response.get("Error", {}).get("Message", "") if isinstance(response, dict) else ""


def is_botocore_error(error: BaseException) -> bool:
    return any(c.__module__.startswith("botocore") for c in type(error).__mro__)


@contextmanager
def api_errors(what: str) -> Iterator[None]:
    """Turn a botocore failure inside the block into a `ProviderError` naming `what`."""
    try:
        yield
    except Exception as error:
        if not is_botocore_error(error):
            raise
        hint = ""
        if error_code(error) in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
            hint = " (the credentials lack this permission)"
        raise ProviderError(f"{what} failed: {error}{hint}") from error
