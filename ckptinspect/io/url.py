"""Which backend a location needs: URL schemes, the optional extra that installs each, and `location()`."""

from __future__ import annotations

import enum
import importlib.util
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ckptinspect.errors import UsageError


class Scheme(enum.Enum):
    """The URL schemes ckptinspect reads. The value is the scheme as typed."""

    S3 = "s3"
    GS = "gs"
    GCS = "gcs"
    AZ = "az"
    ABFS = "abfs"
    ABFSS = "abfss"
    MSC = "msc"

    @property
    def extra(self) -> str:
        """The pip extra that installs this scheme's backend: ``pip install 'ckptinspect[s3]'``."""
        return _EXTRA[self]

    @property
    def module(self) -> str:
        """The module whose presence says the extra is installed."""
        return _MODULE[self]


_EXTRA = {Scheme.S3: "s3", Scheme.GS: "gcs", Scheme.GCS: "gcs", Scheme.AZ: "azure", Scheme.ABFS: "azure",
          Scheme.ABFSS: "azure", Scheme.MSC: "msc"}
# s3://: boto3 (the `[s3]` extra, `boto3_backend.py`), or s3fs where it is installed without boto3
_MODULE = {Scheme.S3: "boto3", Scheme.GS: "gcsfs", Scheme.GCS: "gcsfs", Scheme.AZ: "adlfs", Scheme.ABFS: "adlfs",
           Scheme.ABFSS: "adlfs", Scheme.MSC: "multistorageclient"}
_SCHEMES = {s.value: s for s in Scheme}


class MissingExtra(UsageError):
    """A URL whose backend is not installed (exit 2, naming the extra)."""


def is_url(text: str) -> bool:
    """True for ``scheme://...`` with a scheme ckptinspect knows (including ``file://``)."""
    head, sep, _ = text.partition("://")
    return bool(sep) and (head.lower() in _SCHEMES or head.lower() == "file")


def split_url(text: str) -> tuple[Scheme, str, str]:
    """(scheme, authority, key) of an object-storage URL; the key has no leading or trailing slash.

    The authority is the bucket (s3, gs), the container (az; ``container@account...`` for abfs) or the MSC profile.
    """
    parts = urlsplit(text)
    scheme = _SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        raise UsageError(f"{text}: unsupported URL scheme {parts.scheme!r} (s3, gs, az, abfs, msc, file)")
    if not parts.netloc:
        raise UsageError(f"{text}: no bucket / container / profile after {parts.scheme}://")
    if parts.query or parts.fragment:
        raise UsageError(f"{text}: query strings and fragments are not part of an object path")
    key = unquote(parts.path).strip("/")
    if any(seg in (".", "..") for seg in key.split("/") if seg):
        raise UsageError(f"{text}: '.' and '..' segments are not object keys")
    return scheme, parts.netloc, "/".join(seg for seg in key.split("/") if seg)


def installed(module: str) -> bool:
    """True when `module` can be imported (a test that blocks it with ``sys.modules[name] = None`` says no)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require_extra(scheme: Scheme) -> None:
    """`MissingExtra` (exit 2) when the backend for `scheme` is not importable."""
    if not installed(scheme.module) and not (scheme is Scheme.S3 and installed("s3fs")):
        raise MissingExtra(
            f"{scheme.value}:// needs the '{scheme.extra}' extra: pip install 'ckptinspect[{scheme.extra}]' "
            f"(module {scheme.module} is not installed)"
        )


def location(text: str) -> Path:
    """A user's PATH argument as a `Path`: local paths as given, ``file://`` as a local path, object-storage URLs
    as an `ObjectPath`. Raises `UsageError` for a malformed URL or `MissingExtra` for a missing backend."""
    if not is_url(text):
        return Path(text)
    if text.lower().startswith("file://"):
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise UsageError(f"{text}: file:// URLs name a local path (file:///abs/path)")
        return Path(unquote(parts.path))
    scheme, authority, key = split_url(text)
    require_extra(scheme)
    from ckptinspect.io.objpath import ObjectPath

    return ObjectPath.of(scheme, authority, key)
