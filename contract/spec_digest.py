"""The digest of a spec file that its generated package records. Serving compares it
with the file to refuse generated code that is older than its spec; standard library
only, so that check costs nothing at start-up."""
from __future__ import annotations

import hashlib
from pathlib import Path


def spec_digest(path: str | Path) -> str:
    """sha256 of the spec's text, line endings normalized (a CRLF checkout is the same
    spec)."""
    text = Path(path).read_bytes().replace(b"\r\n", b"\n")
    return hashlib.sha256(text).hexdigest()
