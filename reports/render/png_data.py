"""PNG bytes and their data URIs, checked before they reach a report.

A figure the report shows comes from matplotlib or from the disk cache
(reports/base/disk_cache.py); either way it is pasted into report.html as
`<img src="data:image/png;base64,...">` and written as report.herd.png. Both are checked here
against their own format: a PNG starts with its 8-byte signature and ends with the IEND chunk
(PNG spec, sections 5.2 and 11.2.5); a data URI is the fixed prefix followed only by base64
characters that decode to such a PNG. Anything else raises ValueError (the cache reads that as
a miss), so no text of an entry's choosing can reach the page.
"""
from __future__ import annotations

import base64
import re

SIGNATURE = b"\x89PNG\r\n\x1a\n"
IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"     # length 0, type, CRC: the last chunk of every PNG
URI_PREFIX = "data:image/png;base64,"
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


def checked_png(data: bytes) -> bytes:
    """data, when it is a whole PNG (signature to IEND); ValueError otherwise."""
    if not (data.startswith(SIGNATURE) and data.endswith(IEND)):
        raise ValueError("not a PNG")
    return data


def png_uri(data: bytes) -> str:
    """The data URI of a checked PNG."""
    return URI_PREFIX + base64.b64encode(checked_png(data)).decode("ascii")


def checked_png_uri(uri: str) -> str:
    """uri, when it is exactly a PNG's data URI; ValueError otherwise."""
    if not (uri.startswith(URI_PREFIX) and _BASE64.fullmatch(uri, len(URI_PREFIX))):
        raise ValueError("not a PNG data URI")
    checked_png(base64.b64decode(uri[len(URI_PREFIX):], validate=True))
    return uri
