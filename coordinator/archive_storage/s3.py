"""S3 for the archive storage: the client factory (CLP's authentication) and bounded retries.

Clients are path-style, with the configured endpoint, region ``region_code`` or ``us-east-1``, and
CLP's authentication (``s3_client``; also used to put the objects ``coordinator submit`` ingests).

**S3 calls are retried**, bounded (``with_s3_retries``): connection errors, timeouts, HTTP 5xx and
throttling get ``S3_ATTEMPTS`` attempts in all, 0.2 s doubling to at most 2 s apart (about 3 s of
waiting), then the call fails saying how many attempts were made over how long. The archive
storage's clients have botocore's own retries off, so the bound is this one. Other errors (a
missing bucket, access denied) fail at once. ``describe_s3_error`` names the cause of a failure:
``bucket b does not exist (NoSuchBucket, HTTP 404)``, ``access denied (AccessDenied, HTTP 403)``.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from coordinator.archive_storage.errors import ArchiveStorageError
from coordinator.task_io import (
    AwsAuthentication,
    CredentialsAuthentication,
    EnvVarsAuthentication,
    ProfileAuthentication,
)

DEFAULT_REGION = "us-east-1"
S3_ATTEMPTS = 5
"""Attempts of one S3 call (upload, delete, listing page) before it fails."""
S3_FIRST_DELAY_SECS = 0.2
S3_MAX_DELAY_SECS = 2.0
S3_CONNECT_TIMEOUT_SECS = 5
S3_READ_TIMEOUT_SECS = 60

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
_THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
    }
)


def describe_s3_error(error: Exception, bucket: str) -> str:
    """The cause of a failed S3 call: S3's error code and HTTP status, or the connection error."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        details = response.get("Error", {})
        code = str(details.get("Code", "")) or "unknown error"
        status = s3_status(error)
        message = str(details.get("Message", "")).rstrip(".")
        where = f"{code}, HTTP {status}" if status else code
        if code == "NoSuchBucket":
            return f"bucket {bucket} does not exist ({where})"
        if code == "AccessDenied" or (status == 403 and code in ("403", "Forbidden")):
            return f"access denied ({where}){f': {message}' if message else ''}"
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
            return f"the credentials were refused ({where}){f': {message}' if message else ''}"
        return f"{message or 'S3 refused the request'} ({where})"
    return str(error)


def with_s3_retries(call: Callable[[], _T], *, attempts: int = S3_ATTEMPTS) -> _T:
    """``call()``, retried on connection errors, timeouts, HTTP 5xx and throttling (bounded).

    Waits 0.2 s doubling to at most 2 s between attempts. The last error is raised with a note
    saying how many attempts were made over how long; errors that would not change on another
    attempt are raised at once.
    """
    started = time.monotonic()
    delay = S3_FIRST_DELAY_SECS
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except s3_errors() as error:
            if not _is_transient_s3_error(error):
                raise
            if attempt == attempts:
                elapsed = time.monotonic() - started
                raise _S3Unavailable(
                    f"S3 still failing after {attempts} attempt(s) over {elapsed:.1f} s: "
                    f"{describe_s3_error(error, '')}"
                ) from error
            _log.warning(
                "S3 call failed (attempt %d of %d), retrying in %.1f s: %s",
                attempt,
                attempts,
                delay,
                error,
            )
            time.sleep(delay)
            delay = min(delay * 2, S3_MAX_DELAY_SECS)
    raise AssertionError("unreachable")


class _S3Unavailable(Exception):
    """A transient S3 error that outlasted the retries (its message says so)."""


def _is_transient_s3_error(error: Exception) -> bool:
    exceptions: Any = importlib.import_module("botocore.exceptions")
    if isinstance(error, (exceptions.ConnectionError, exceptions.HTTPClientError)):
        return True
    if isinstance(error, exceptions.ClientError):
        status = s3_status(error)
        code = str(error.response.get("Error", {}).get("Code", ""))
        return status >= 500 or status == 429 or code in _THROTTLING_CODES
    return False


def s3_status(error: Exception) -> int:
    """The HTTP status of a failed S3 call; 0 when it got no answer."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return 0
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return int(status) if isinstance(status, int) else 0


# boto3 ships no type information; its use stays in these functions, typed as Any.


def s3_client(
    endpoint_url: str | None,
    region_code: str | None,
    authentication: AwsAuthentication,
    *,
    max_attempts: int | None = None,
) -> Any:
    """A path-style boto3 S3 client with CLP's authentication.

    Fails with ``ArchiveStorageError`` for unusable credentials (``env_vars`` that are not set).

    ``max_attempts`` caps botocore's own attempts per call (``None``: its standard mode's 3).
    """
    boto3: Any = importlib.import_module("boto3")
    retries: dict[str, Any] = {"mode": "standard"}
    if max_attempts is not None:
        retries["total_max_attempts"] = max_attempts
    config: Any = importlib.import_module("botocore.config").Config(
        s3={"addressing_style": "path"},
        retries=retries,
        connect_timeout=S3_CONNECT_TIMEOUT_SECS,
        read_timeout=S3_READ_TIMEOUT_SECS,
    )
    session = boto3.session.Session(**_session_arguments(authentication))
    return session.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region_code or DEFAULT_REGION,
        config=config,
    )


def s3_errors() -> tuple[type[Exception], ...]:
    """What a failed S3 call raises: botocore's errors, or retries that ran out."""
    exceptions: Any = importlib.import_module("botocore.exceptions")
    return (exceptions.BotoCoreError, exceptions.ClientError, _S3Unavailable)


def _session_arguments(authentication: AwsAuthentication) -> dict[str, str]:
    if isinstance(authentication, CredentialsAuthentication):
        credentials = authentication.credentials
        arguments = {
            "aws_access_key_id": credentials.access_key_id,
            "aws_secret_access_key": credentials.secret_access_key.get_secret_value(),
        }
        if credentials.session_token is not None:
            arguments["aws_session_token"] = credentials.session_token.get_secret_value()
        return arguments
    if isinstance(authentication, ProfileAuthentication):
        return {"profile_name": authentication.profile}
    if isinstance(authentication, EnvVarsAuthentication):
        # CLP's env_vars means these variables, and only these: no fallback to other sources.
        missing = [
            name
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
            if not os.environ.get(name)
        ]
        if missing:
            raise ArchiveStorageError(
                f"archive output authentication env_vars: ${', $'.join(missing)} not set"
            )
        arguments = {
            "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
        }
        if os.environ.get("AWS_SESSION_TOKEN"):
            arguments["aws_session_token"] = os.environ["AWS_SESSION_TOKEN"]
        return arguments
    return {}
