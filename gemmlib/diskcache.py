"""A small on-disk cache of compiled kernels that cannot hand back a wrong entry.

One file per key, ``<dir>/<key>.cubin``, laid out as

    MAGIC                          (one line: format and version)
    header                         (one line of JSON: payload size, SHA-256, metadata)
    payload                        (the machine code, exactly ``size`` bytes)

* **Writes are atomic.**  An entry is written to a private temporary file in
  the same directory and moved into place with ``os.replace``, so a reader
  sees the old file, the new one, or none -- never half of one -- and two
  processes writing the same key at once both succeed (the last move wins;
  both files are complete).
* **Reads are verified.**  A wrong magic line, unparsable header, short or
  long payload or a SHA-256 mismatch (a truncated, corrupted or foreign
  file) makes :func:`load` return None and delete the file, so the caller
  rebuilds and stores a good entry.  Nothing here raises on a bad file.

The keys are made by :mod:`gemmlib.dispatch` (kernel source, parameters,
compute capability, versions); this module only stores bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

MAGIC = b"gemmlib-kernel-cache 1\n"


def entry_path(directory: Path, key: str) -> Path:
    return Path(directory) / f"{key}.cubin"


def store(directory: Path, key: str, payload: bytes, meta: dict) -> Path | None:
    """Write an entry atomically; returns its path, or None when the cache is not writable."""
    directory = Path(directory)
    header = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest(), "meta": meta}
    blob = MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{key}.", suffix=".tmp")
    except OSError:
        return None  # a read-only home, a full disk: run without the cache
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        path = entry_path(directory, key)
        os.replace(tmp, path)
        return path
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None


def load(directory: Path, key: str) -> tuple[bytes, dict] | None:
    """(payload, meta) of a verified entry, or None (missing, or bad and now removed)."""
    path = entry_path(directory, key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    entry = _parse(data)
    if entry is None:
        discard(directory, key)
    return entry


def _parse(data: bytes) -> tuple[bytes, dict] | None:
    if not data.startswith(MAGIC):
        return None
    rest = data[len(MAGIC):]
    nl = rest.find(b"\n")
    if nl < 0:
        return None
    try:
        header = json.loads(rest[:nl])
        size, digest, meta = int(header["size"]), str(header["sha256"]), dict(header["meta"])
    except (ValueError, KeyError, TypeError):
        return None
    payload = rest[nl + 1:]
    if len(payload) != size or hashlib.sha256(payload).hexdigest() != digest:
        return None
    return payload, meta


def discard(directory: Path, key: str) -> None:
    try:
        entry_path(directory, key).unlink()
    except OSError:
        pass
