"""Classifying client exceptions (botocore, aiohttp, google, azure, requests) into `Fault`s, by what they carry.

Clients wrap one another (s3fs turns a botocore `ClientError` into an `OSError` whose cause is the original), so the
whole cause chain is inspected: an HTTP status or an S3-style error code decides, then the exception's class name.
No client is imported here; each one is optional.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from ckptinspect.io.backend import Fault

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                              "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequests", "503", "500"})
_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "404", "NotFound", "BlobNotFound", "ContainerNotFound"})
_DENIED_CODES = frozenset({"AccessDenied", "403", "401", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                           "ExpiredToken", "AuthorizationFailure", "AuthenticationFailed"})
_TRANSIENT_NAMES = ("Timeout", "ServerDisconnected", "ConnectionReset", "ConnectionClosed", "ResponseStreamingError",
                    "IncompleteRead", "ClientPayloadError", "ProtocolError", "ConnectionError", "RemoteDisconnected",
                    "ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError")
_DENIED_NAMES = ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError",
                 "ClientAuthenticationError", "RefreshError")
_UNREACHABLE_NAMES = ("InvalidEndpoint", "NameResolution", "gaierror")


def chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and its causes / contexts, each once."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < 16:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _http(e: BaseException) -> tuple[int | None, str | None]:
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        err = resp.get("Error") if isinstance(resp.get("Error"), dict) else {}
        meta = resp.get("ResponseMetadata") if isinstance(resp.get("ResponseMetadata"), dict) else {}
        status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        code = err.get("Code") if isinstance(err, dict) else None
        return (status if isinstance(status, int) else None), (str(code) if code is not None else None)
    for attr in ("status", "status_code", "code"):
        v = getattr(e, attr, None)
        if isinstance(v, int) and 100 <= v < 600:
            return v, None
    return None, None


def classify(exc: BaseException) -> Fault:
    """What `exc` means for a storage request."""
    for e in chain(exc):
        status, code = _http(e)
        if status == 412 or code in ("PreconditionFailed", "ConditionNotMet"):
            return Fault.CHANGED
        if status in _TRANSIENT_STATUS or code in _TRANSIENT_CODES:
            return Fault.TRANSIENT
        if status in (401, 403) or code in _DENIED_CODES:
            return Fault.DENIED
        if status == 404 or code in _MISSING_CODES:
            return Fault.MISSING
    for e in chain(exc):
        name = type(e).__name__
        if any(n in name for n in _DENIED_NAMES):
            return Fault.DENIED
        if any(n in name for n in _UNREACHABLE_NAMES) or "Name or service not known" in str(e):
            return Fault.UNREACHABLE
        if isinstance(e, (TimeoutError, asyncio.TimeoutError, ConnectionError)) or any(
                n in name for n in _TRANSIENT_NAMES):
            return Fault.TRANSIENT
        if isinstance(e, FileNotFoundError):
            return Fault.MISSING
        if isinstance(e, PermissionError):
            return Fault.DENIED
    return Fault.OTHER
