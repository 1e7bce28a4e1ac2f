"""The compiled-executable disk cache (docs/serving.md, "Executable cache"): entries, bound.

An entry is ``<CacheKey digest>.xexe``: :data:`_HEADER`, JSON metadata (key, ``info``), then
PJRT's serialized executable (``compile.serialize_executable``). Imports no JAX."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hloserve.errors import InvalidArgumentError

log = logging.getLogger("hloserve.triton_backend.runtime.executable_cache")

MAGIC = b"HLOSXEXE"
#: Entry format written; formats read: MIN..MAX (others are ignored and rewritten).
ENTRY_FORMAT = 1
MIN_ENTRY_FORMAT = 1
MAX_ENTRY_FORMAT = 1
#: magic, format version, metadata bytes, payload bytes, SHA-256(metadata + payload)
_HEADER = struct.Struct(">8sIIQ32s")
SUFFIX = ".xexe"
_TMP_PREFIX = ".tmp-"
#: a temporary file older than this (seconds) was left by a writer that died
STALE_TMP_S = 3600.0
#: 4 GiB; serialized CPU executables measured 0.1-4 MiB each (benchmarks/executable_cache.py)
DEFAULT_MAX_BYTES = 4 << 30
#: where an executable came from (log, the ``source`` metric label)
COMPILED = "compiled"
FROM_CACHE = "cache"


@dataclass(frozen=True)
class ExecutableLabel:
    """Which executable of which model (``variant`` e.g. ``"s32"``, ``batch_size`` 0 when
    unbatched); ``model`` is not in the key."""

    model: str
    variant: str = ""
    batch_size: int = 0

    def __str__(self) -> str:
        variant = f" variant {self.variant}" if self.variant else ""
        return f"model {self.model!r}{variant} batch size {self.batch_size}"


@dataclass(frozen=True)
class CachedEntry:
    """A stored serialized executable and the ``info`` mapping stored beside it."""

    payload: bytes
    info: Mapping[str, Any]


@dataclass(frozen=True)
class CacheKey:
    """Everything that changes a compiled executable's binary (docs/serving.md, "Executable
    cache"); equal keys share an entry. Hashes are SHA-256 hex."""

    artifact_sha256: str
    platform: str
    platform_version: str
    device_kind: str
    device_id: int
    jaxlib_version: str
    compile_options_sha256: str
    xla_flags: str
    x64: bool
    variant: str
    batch_size: int

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the fields with :data:`ENTRY_FORMAT`: the entry's file name."""
        text = json.dumps({"format": ENTRY_FORMAT, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


class ExecutableCache:
    """Serialized executables on disk under a size bound, counting where each came from
    (``directory`` None: off; made with mode 0700; shareable by processes). ``observer(model,
    source)`` is called by :meth:`counted`."""

    def __init__(
        self,
        directory: Path | str | None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        *,
        observer: Callable[[str, str], None] | None = None,
    ) -> None:
        if max_bytes < 1:
            raise InvalidArgumentError(f"executable cache bound must be >= 1 byte, got {max_bytes}")
        self.directory = Path(directory) if directory is not None else None
        self.max_bytes = max_bytes
        self._observer = observer
        self._lock = threading.Lock()
        self.counts = {COMPILED: 0, FROM_CACHE: 0}
        self.seconds = {COMPILED: 0.0, FROM_CACHE: 0.0}

    @property
    def enabled(self) -> bool:
        """Whether entries are read and written."""
        return self.directory is not None

    def path(self, key: CacheKey) -> Path:
        """The entry file of ``key``; InvalidArgumentError when the cache is off."""
        if self.directory is None:
            raise InvalidArgumentError("the executable cache is off")
        return self.directory / f"{key.digest}{SUFFIX}"

    def get(self, key: CacheKey, label: ExecutableLabel | None = None) -> CachedEntry | None:
        """The entry under ``key`` (marked used), or None; a bad entry is logged and deleted."""
        if self.directory is None:
            return None
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("executable cache: cannot read %s (%s): recompiling", path, exc)
            return None
        problem, entry = _parse_entry(data, key)
        if problem is not None:
            log.warning(
                "executable cache: ignoring entry %s for %s: %s; recompiling and rewriting it",
                path.name,
                label or "an executable",
                problem,
            )
            self.discard(key)
            return None
        with contextlib.suppress(OSError):  # read-only directory: the LRU time just stays
            os.utime(path)
        return entry

    def put(
        self,
        key: CacheKey,
        payload: bytes,
        label: ExecutableLabel | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> bool:
        """Store ``payload`` and ``info`` (JSON) under ``key`` atomically, then apply the bound;
        whether it was written (failures, e.g. a full disk, are logged, not raised)."""
        if self.directory is None:
            return False
        document = {"key": dataclasses.asdict(key), "info": dict(info or {})}
        metadata = json.dumps(document, sort_keys=True).encode()
        digest = hashlib.sha256(metadata + payload).digest()
        header = _HEADER.pack(MAGIC, ENTRY_FORMAT, len(metadata), len(payload), digest)
        size = len(header) + len(metadata) + len(payload)
        if size > self.max_bytes:
            log.warning(
                "executable cache: %s is %d bytes, over the bound of %d bytes: not cached",
                label or "an executable",
                size,
                self.max_bytes,
            )
            return False
        path = self.path(key)
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=SUFFIX, dir=self.directory)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(header)
                    out.write(metadata)
                    out.write(payload)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            _fsync_directory(self.directory)
        except OSError as exc:
            log.warning("executable cache: cannot write %s (%s): not cached", path, exc)
            return False
        self.cleanup(keep=path)
        return True

    def discard(self, key: CacheKey) -> None:
        """Delete the entry of ``key`` if there is one."""
        if self.directory is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path(key).unlink()

    def cleanup(self, keep: Path | None = None) -> int:
        """Delete LRU entries (never ``keep``) until at most ``max_bytes`` remain, and stale
        temporary files; the bytes deleted."""
        if self.directory is None:
            return 0
        entries, total, now = [], 0, time.time()
        try:
            listing = list(os.scandir(self.directory))
        except OSError:
            return 0
        for item in listing:
            try:
                stat = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if item.name.startswith(_TMP_PREFIX):
                if now - stat.st_mtime > STALE_TMP_S:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(item.path)
                continue
            if item.name.endswith(SUFFIX) and item.is_file(follow_symlinks=False):
                entries.append((stat.st_mtime, item.path, stat.st_size))
                total += stat.st_size
        freed = 0
        for _, path, size in sorted(entries):
            if total <= self.max_bytes:
                break
            if keep is not None and Path(path) == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                log.info("executable cache: evicted %s (%d bytes, least recently used)", path, size)
            total -= size
            freed += size
        return freed

    def counted(self, label: ExecutableLabel | None, source: str, seconds: float) -> None:
        """Count one executable made ready: ``source`` is :data:`COMPILED` or :data:`FROM_CACHE`."""
        with self._lock:
            self.counts[source] += 1
            self.seconds[source] += seconds
        if self._observer is not None:
            self._observer(label.model if label is not None else "", source)

    def summary(self) -> str:
        """One line for the start log: how many executables were compiled and how many loaded."""
        with self._lock:
            counts, seconds = dict(self.counts), dict(self.seconds)
        where = f"cache {self.directory}" if self.directory is not None else "cache off"
        return (
            f"executables: {counts[COMPILED]} compiled ({seconds[COMPILED]:.2f} s), "
            f"{counts[FROM_CACHE]} loaded from the cache ({seconds[FROM_CACHE]:.2f} s); {where}"
        )


def _parse_entry(data: bytes, key: CacheKey) -> tuple[str | None, CachedEntry | None]:
    """(problem or None, the entry)."""
    if len(data) < _HEADER.size:
        return f"truncated ({len(data)} bytes, shorter than the header)", None
    magic, version, meta_len, payload_len, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        return "not an hloserve executable cache entry (bad magic)", None
    if not MIN_ENTRY_FORMAT <= version <= MAX_ENTRY_FORMAT:
        return (
            f"entry format {version}, this hloserve reads {MIN_ENTRY_FORMAT}..{MAX_ENTRY_FORMAT}"
        ), None
    expected = _HEADER.size + meta_len + payload_len
    if len(data) != expected:
        return f"truncated or padded ({len(data)} bytes, the header says {expected})", None
    body = memoryview(data)[_HEADER.size :]
    if hashlib.sha256(body).digest() != digest:
        return "checksum mismatch (corrupt)", None
    try:
        metadata = json.loads(bytes(body[:meta_len]))
        stored, info = dict(metadata["key"]), dict(metadata["info"])
    except (ValueError, KeyError, TypeError):
        return "unreadable metadata", None
    wanted = dataclasses.asdict(key)
    if stored != wanted:
        changed = sorted(k for k in wanted if stored.get(k) != wanted[k])
        return f"written for another key (differs in {changed})", None
    return None, CachedEntry(bytes(body[meta_len:]), info)


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
