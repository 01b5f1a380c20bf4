"""What each remote backend is: its URI schemes, its client library, and its answers.

The store (:mod:`.store`) asks here which schemes have an atomic create, which
filesystem serves a URI (a missing client library is one line naming the
extra that installs it), what a refused create was answered whatever the
client made of it, and what MD5 a store reports for an object.
"""

from __future__ import annotations

import base64
import re
from typing import Any, Dict, Optional, Tuple

import fsspec

__all__ = ["GCS", "LISTING_CACHE_PROTOCOLS", "REMOTE_ATOMIC", "filesystem", "md5_of", "refusal"]

S3 = frozenset({"s3", "s3a"})
GCS = frozenset({"gs", "gcs"})
AZURE = frozenset({"az", "abfs", "abfss"})
REMOTE_ATOMIC = S3 | GCS | AZURE
LISTING_CACHE_PROTOCOLS = S3 | GCS | AZURE
# The client library each remote backend needs, and the extra that installs it.
LIBRARIES = {**{p: ("s3fs", "s3") for p in S3}, **{p: ("gcsfs", "gcs") for p in GCS},
             **{p: ("adlfs", "azure") for p in AZURE}}


def filesystem(uri: str, scheme: Optional[str], options: Dict[str, Any]):
    """The fsspec filesystem and root of ``uri``; a missing client library is one line."""
    if scheme in GCS and _is_emulator(options.get("endpoint_url")):
        # gcsfs's experimental zonal-bucket check tries gRPC first and waits a
        # minute per call against an emulator: use its plain filesystem there.
        try:
            from gcsfs.core import GCSFileSystem
        except ImportError as exc:
            raise _missing(uri, scheme) from exc
        fs = GCSFileSystem(**options)
        return fs, fs._strip_protocol(uri)
    try:
        return fsspec.core.url_to_fs(uri, **options)
    except ImportError as exc:
        if scheme in LIBRARIES:
            raise _missing(uri, scheme) from exc
        raise


def _is_emulator(endpoint: Any) -> bool:
    if not isinstance(endpoint, str) or not endpoint:
        return False
    host = endpoint.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    return not host.endswith("googleapis.com")


def _missing(uri: str, scheme: str) -> ImportError:
    library, extra = LIBRARIES[scheme]
    return ImportError(f"{uri}: the {scheme}:// backend needs {library}; install it with "
                       f"pip install 'beam-upsert-supertable[{extra}]'")


def md5_of(info: Dict[str, Any]) -> Optional[str]:
    """The hex MD5 a store reports for an object, or None."""
    etag = info.get("ETag")
    if isinstance(etag, str) and re.fullmatch(r'"?[0-9a-f]{32}"?', etag):
        return etag.strip('"')    # S3: a single-part PUT's ETag
    digest = info.get("md5Hash")   # GCS: base64
    if digest is None:
        digest = (info.get("content_settings") or {}).get("content_md5")   # Azure: bytes
    try:
        raw = base64.b64decode(digest) if isinstance(digest, str) else \
            bytes(digest) if digest is not None else None
    except (ValueError, TypeError):
        return None
    return raw.hex() if raw is not None and len(raw) == 16 else None


def refusal(exc: BaseException) -> Optional[str]:
    """What a failed conditional create was answered, whatever the client made of it.

    ``"exists"``: the object is there (S3-compatible ``412 PreconditionFailed``,
    which s3fs reports as ``OSError(EINVAL)`` unless the server names the
    condition; GCS ``412`` on ``ifGenerationMatch``; Azure ``409
    BlobAlreadyExists`` or ``412``). ``"conflict"``: another conditional write
    of the key was in flight (AWS ``409 ConditionalRequestConflict``): retry.
    None: anything else.
    """
    chain, seen = [], 0
    while exc is not None and seen < 8:
        chain.append(exc)
        seen += 1
        exc = exc.__cause__ or exc.__context__
    for link in chain:   # what the store answered decides, where it is known
        code, status = _answer(link)
        if code == "ConditionalRequestConflict":
            return "conflict"
        if status == 412 or code in ("PreconditionFailed", "BlobAlreadyExists",
                                     "ConditionNotMet"):
            return "exists"
        if code is not None or status is not None:
            return None   # another answer (an Azure 409 lease or container conflict, say)
    return "exists" if any(isinstance(link, FileExistsError) for link in chain) else None


def _answer(exc: BaseException) -> Tuple[Optional[str], Optional[int]]:
    """The (error code, HTTP status) an exception of boto, gcsfs or azure carries."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):   # botocore ClientError
        error = response.get("Error") or {}
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return error.get("Code"), status if isinstance(status, int) else None
    status = getattr(exc, "status_code", None)   # azure.core HttpResponseError
    if isinstance(status, int):
        code = getattr(exc, "error_code", None)
        code = getattr(code, "value", code)   # a StorageErrorCode member, or its string
        return (str(code) if code is not None else None), status
    status = getattr(exc, "code", None)   # gcsfs HttpError
    if isinstance(status, int) and not isinstance(status, bool):
        return None, status
    return None, None
