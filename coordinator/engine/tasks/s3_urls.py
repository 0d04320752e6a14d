"""The URL ``clp-s`` reads an S3 object from (``docs/clp.md``, The compress task).

Mirrors CLP's ``generate_s3_url`` (``clp-rust-utils/src/s3/url.rs``) row for row:

=============================  ==================================================================
``endpoint_url``               URL
=============================  ==================================================================
unset, no region               ``https://{bucket}.s3.amazonaws.com/{key}``
unset, region                  ``https://{bucket}.s3.{region}.amazonaws.com/{key}``
custom, no region              ``{scheme}://[s3.]{host[:port]}/{bucket}/{key}`` (trailing ``/`` of
                               the endpoint dropped)
custom, region                 ``{scheme}://[s3.]{region}.{host[:port]}/{bucket}/{key}``
anything else                  "unsupported S3 endpoint" (other schemes, upper-case hosts, paths)
=============================  ==================================================================

A custom endpoint must match ``^(http|https)://(s3\\.)?[a-z0-9.-]+(:[0-9]+)?/?$`` in full; unlike
Python's ``$``, Rust's ends the text, so a trailing newline is refused here too. With a custom
endpoint a set region is prepended to the host, which breaks IP-address and single-label endpoints:
leave the region unset for those (as CLP's documentation says).

**Object keys are put into the URL verbatim, as CLP does, and keys clp-s cannot fetch are refused
(a deliberate difference).** Measured with clp-s 0.12.1b0 (``--auth s3``):

* clp-s hands the URL to libcurl as it is: a key with a space makes an invalid request line (HTTP
  400), and ``%``, ``?``, ``#`` or non-ASCII bytes reach the server as another key (404); libcurl
  also removes ``.`` and ``..`` path segments, so ``a/../b`` would read the object ``b``;
* percent-encoding the key is no way out: clp-s computes the SigV4 query signature over the URL path
  encoded *again* (``%20`` is signed as ``%2520``), so S3 answers 403 ``SignatureDoesNotMatch``
  (moto, which does not check signatures, would accept it and hide the problem).

So no spelling of such a key works, and CLP's task would fail on it with a curl error, or read the
wrong object. ``s3_object_url`` fails up front instead, naming the key. Every other printable ASCII
character (``+``, ``=``, ``&``, ``@``, ``!``, ``(``, … ) is sent unchanged and signed the way S3
verifies it.
"""

from __future__ import annotations

import re

from coordinator.engine.tasks.context import TaskError

AWS_ENDPOINT = "amazonaws.com"

# Groups as in CLP's pattern: scheme, the optional "s3." prefix, and host[:port] without the
# trailing slash. fullmatch() stands in for ^…$ (see the module docstring).
_ENDPOINT_URL = re.compile(
    r"(?P<scheme>http|https)://(?:(?P<s3>s3)\.)?(?P<endpoint>[a-z0-9.-]+(?::[0-9]+)?)/?"
)
# Printable ASCII is sent unchanged by libcurl and signed by clp-s the way S3 checks it, except
# these, which end or change the URL path (space and control characters are not printable).
_URL_SPECIAL = frozenset("%?#")


def s3_object_url(endpoint_url: str | None, region_code: str | None, bucket: str, key: str) -> str:
    """The URL clp-s reads ``key`` of ``bucket`` from, built by CLP's rules.

    Fails with ``TaskError``: "unsupported S3 endpoint …" naming an endpoint outside CLP's
    pattern; for an empty bucket or key; and for a key clp-s cannot fetch (``object_key_problem``).
    """
    if not bucket:
        raise TaskError("S3 bucket name is empty")
    problem = object_key_problem(key)
    if problem is not None:
        raise TaskError(f"cannot read object {key!r} of bucket {bucket!r} with clp-s: {problem}")
    if endpoint_url is None:
        if region_code is None:
            return f"https://{bucket}.s3.{AWS_ENDPOINT}/{key}"
        return f"https://{bucket}.s3.{region_code}.{AWS_ENDPOINT}/{key}"
    match = _ENDPOINT_URL.fullmatch(endpoint_url)
    if match is None:
        raise TaskError(
            f"unsupported S3 endpoint {endpoint_url!r}: expected http(s)://host[:port] with a "
            "lower-case host and no path"
        )
    scheme = match["scheme"]
    s3_prefix = "s3." if match["s3"] is not None else ""
    endpoint = match["endpoint"]
    if region_code is None:
        return f"{scheme}://{s3_prefix}{endpoint}/{bucket}/{key}"
    return f"{scheme}://{s3_prefix}{region_code}.{endpoint}/{bucket}/{key}"


def object_key_problem(key: str) -> str | None:
    """Why clp-s cannot fetch ``key`` over HTTP (see the module docstring), or ``None``.

    Never raises: the caller decides how to report the reason.
    """
    if not key:
        return "the key is empty"
    bad = sorted({c for c in key if not "!" <= c <= "~" or c in _URL_SPECIAL})
    if bad:
        shown = ", ".join(repr(character) for character in bad[:5])
        return (
            f"it contains {shown}, which clp-s neither escapes in the request nor signs the way "
            "S3 checks it (rename the object, e.g. without spaces, '%', '?', '#' or non-ASCII)"
        )
    if any(segment in (".", "..") for segment in key.split("/")):
        return "its '.' or '..' path segments would be resolved away by clp-s's HTTP client"
    return None
