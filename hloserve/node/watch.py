"""``hloserve serve BUNDLES --watch``: bundles added, changed or removed while the server runs.

ReactantServer's dynamic mode on Triton's explicit model control (docs/serving.md, "Watching
the bundles directory"). Every ``--watch-interval`` seconds the watcher takes a fingerprint of
each bundle folder (:func:`fingerprint`: every file's path, size, modification time and inode).
A change is acted on once two polls in a row see the same new content (:class:`Debouncer`), so
a bundle still being copied is left alone. Then, per bundle:

* **added or changed**: the bundle is validated (:func:`hloserve.bundle.check_bundle`), its
  model alone is built (:func:`~hloserve.model_repository_tools.build.plan_repository` and
  :func:`~hloserve.model_repository_tools.build.write_repository` into a staging directory
  beside the repository) and moved into the repository as a new Triton version directory
  (``<model>/<N+1>``, one rename) with ``config.pbtxt`` pointing its front at it (one rename),
  then loaded through Triton's repository API. Triton keeps the old version serving until the
  new one is ready and keeps it when the load fails ("if the reload fails for any reason the
  loaded model will be unchanged", Triton's Model Management guide, explicit mode); on failure
  the repository is put back as it was. The runtime model is never reloaded: the new front
  instances acquire their bundle from the runtime next to the old ones, and the executable
  cache (keyed by the artifact's bytes, not the model's name) spares compiling an executable
  it has seen, such as a bundle renamed or one whose weights alone changed.
* **removed**: the model is unloaded (requests then get NOT_FOUND) and its folder deleted.
* Meta models that call a model that was reloaded are reloaded after it (callees first).

What each model's last change did (version, state, time, error) is kept in
:class:`ModelRecord` objects that ``hloserve status --models`` shows through the supervisor's
admin port (``/models``, :mod:`hloserve.observability.supervisor`).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Seconds between two polls of the bundles directory (ReactantServer's default).
DEFAULT_WATCH_INTERVAL_S = 15.0

#: One file of a bundle: (path relative to the bundle, size in bytes, mtime in ns, inode).
FileStamp = tuple[str, int, int, int]
#: A bundle folder's content as the watcher compares it: every file's stamp, sorted by path.
Fingerprint = tuple[FileStamp, ...]


def fingerprint(bundle: Path) -> Fingerprint:
    """The stamps of every file under ``bundle`` (symbolic links followed).

    Names starting with ``.`` and ``__pycache__`` are left out, as the repository build leaves
    them out of the copy. A file that vanishes while it is read gets the stamp
    ``(path, -1, now, 0)``, which never repeats, so a bundle in the middle of a change is never
    taken as settled.
    """
    stamps: list[FileStamp] = []
    for root, dirs, files in os.walk(bundle, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in files:
            if name.startswith("."):
                continue
            path = Path(root) / name
            rel = str(path.relative_to(bundle))
            try:
                st = path.stat()
            except OSError:
                stamps.append((rel, -1, time.monotonic_ns(), 0))
                continue
            stamps.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(sorted(stamps))


def scan(bundles_dir: Path) -> dict[str, Fingerprint]:
    """Bundle name -> :func:`fingerprint` of every subfolder holding a ``manifest.yaml``."""
    from hloserve.bundle import discover_bundles

    return {path.name: fingerprint(path) for path in discover_bundles(bundles_dir)}


@dataclass(frozen=True)
class Changes:
    """Bundles whose change has settled (each tuple sorted by name)."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


class Debouncer:
    """Which bundles changed and then held still for one poll (ReactantServer's rule).

    Args:
        acted: the content the server holds now, bundle name -> fingerprint.

    :meth:`poll` compares each poll's content with the content acted on: a bundle whose new
    content (or absence) is the same at two polls in a row is reported once, and from then on
    it counts as acted on, whether acting on it succeeded or not (a broken bundle is tried
    again when its content changes again).
    """

    def __init__(self, acted: Mapping[str, Fingerprint]) -> None:
        self.acted: dict[str, Fingerprint] = dict(acted)
        self._seen: dict[str, Fingerprint | None] = {}

    def poll(self, current: Mapping[str, Fingerprint]) -> Changes:
        """Take one poll's content; return the changes that settled at this poll."""
        added: list[str] = []
        changed: list[str] = []
        removed: list[str] = []
        for name in sorted(set(self.acted) | set(current) | set(self._seen)):
            now = current.get(name)
            if now == self.acted.get(name):
                self._seen.pop(name, None)
                continue
            if name not in self._seen or self._seen[name] != now:
                self._seen[name] = now  # new content: wait for it to hold still
                continue
            del self._seen[name]
            if now is None:
                removed.append(name)
                del self.acted[name]
            else:
                (changed if name in self.acted else added).append(name)
                self.acted[name] = now
        return Changes(tuple(added), tuple(changed), tuple(removed))


def dependency_order(models: Iterable[str], calls: Mapping[str, Sequence[str]]) -> list[str]:
    """``models`` ordered so that every model comes after the models it calls (ties by name).

    Args:
        models: the names to order.
        calls: meta model name -> the models it calls; names not here call nothing.
    """
    pending = set(models)
    order: list[str] = []
    while pending:
        ready = sorted(m for m in pending if not pending & set(calls.get(m, ())))
        if not ready:  # a cycle (the validator refuses them): keep going by name
            ready = sorted(pending)[:1]
        order += ready
        pending -= set(ready)
    return order


def callers(models: Iterable[str], calls: Mapping[str, Sequence[str]]) -> set[str]:
    """The meta models that call any of ``models``, directly or through other metas."""
    found: set[str] = set()
    frontier = set(models)
    while frontier:
        frontier = {m for m, callees in calls.items() if frontier & set(callees)} - found
        found |= frontier
    return found


@dataclass
class ModelRecord:
    """What the watcher last did to one model (``hloserve status --models``).

    Attributes:
        name: the model name.
        version: the Triton version serving (0 = none yet).
        state: ``READY`` (serving its bundle's content), ``FAILED`` (the last change did not
            load or did not validate; the previous version, if any, keeps serving) or
            ``UNLOADED`` (the bundle was removed).
        last_reload: UNIX time (s) of the last load, reload or unload; None = loaded at start.
        error: why the last change failed ("" when it did not).
    """

    name: str
    version: int = 1
    state: str = "READY"
    last_reload: float | None = None
    error: str = ""


def model_rows(
    index: Sequence[Mapping[str, Any]], records: Sequence[ModelRecord]
) -> list[dict[str, Any]]:
    """``/models`` rows: Triton's index (version, state, reason) joined with the watcher's
    records (last reload time, error) by name; a removed model keeps its record's row.

    Args:
        index: Triton's repository index (``get_model_repository_index``).
        records: :meth:`BundleWatcher.records`.
    """
    rows: dict[str, dict[str, Any]] = {}
    for entry in index:
        name = str(entry["name"])
        row = rows.get(name)
        if row is not None and row["state"] == "READY":
            continue  # an old version's entry beside the one serving
        rows[name] = {
            "name": name,
            "version": str(entry.get("version", "")),
            "state": str(entry.get("state", "")),
            "reason": str(entry.get("reason", "")),
            "last_reload": None,
            "error": "",
        }
    for record in records:
        row = rows.setdefault(
            record.name,
            {"name": record.name, "version": "", "state": record.state, "reason": ""},
        )
        row["last_reload"] = record.last_reload
        row["error"] = record.error
    return [rows[n] for n in sorted(rows)]


# -- the repository's version folders ---------------------------------------------------------


def model_versions(model_dir: Path) -> list[int]:
    """The Triton version numbers (numeric subfolders) of a model folder, ascending."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit() and p.is_dir())


@dataclass(frozen=True)
class Installed:
    """A model version moved into the repository (:func:`roll_back` undoes it).

    Attributes:
        model_dir: the model's folder in the repository.
        version: the new version number.
        previous_config: the config.pbtxt text it replaced; None = the model is new.
    """

    model_dir: Path
    version: int
    previous_config: str | None


def install_version(staged: Path, repository: Path, name: str) -> Installed:
    """Move a model folder built by ``write_repository`` (version 1) into ``repository``.

    A new model's folder is renamed into place. For a model the repository holds, the staged
    version folder becomes version N+1 (N the highest there) and ``config.pbtxt`` is replaced
    by the staged one pointing its ``hloserve.bundle`` parameter at ``N+1/bundle``; each step is
    one rename, so Triton reads either the old config or the new one. ``staged`` must be on the
    repository's file system.
    """
    from hloserve import names
    from hloserve.model_repository_tools.build import CONFIG_FILE
    from hloserve.model_repository_tools.config import config_text, parse_config_text

    target = repository / name
    if not target.exists():
        os.rename(staged, target)
        return Installed(target, int(names.MODEL_VERSION), None)
    version = max(model_versions(target), default=0) + 1
    previous = (target / CONFIG_FILE).read_text()
    config = parse_config_text((staged / CONFIG_FILE).read_text())
    leaf = Path(names.BUNDLE_SUBDIR).name
    config.parameters[names.PARAM_BUNDLE].string_value = f"{version}/{leaf}"
    os.rename(staged / names.MODEL_VERSION, target / str(version))
    _write_atomic(target / CONFIG_FILE, config_text(config))
    return Installed(target, version, previous)


def roll_back(installed: Installed) -> None:
    """Put the repository back as it was before :func:`install_version`."""
    from hloserve.model_repository_tools.build import CONFIG_FILE

    if installed.previous_config is None:
        shutil.rmtree(installed.model_dir, ignore_errors=True)
        return
    _write_atomic(installed.model_dir / CONFIG_FILE, installed.previous_config)
    shutil.rmtree(installed.model_dir / str(installed.version), ignore_errors=True)


def prune_versions(model_dir: Path, keep_from: int) -> None:
    """Delete the version folders below ``keep_from`` (the version before the current one is
    kept: requests still running on it may read its files)."""
    for version in model_versions(model_dir):
        if version < keep_from:
            shutil.rmtree(model_dir / str(version), ignore_errors=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def check_watch_options(
    *,
    interval_s: float,
    path_is_repository: bool,
    model_control_mode: str | None,
    load_models: Sequence[str],
) -> None:
    """``--watch`` needs explicit mode serving a bundles directory (one server or
    ``--workers N``: every change is made on every worker).

    Raises:
        InvalidArgumentError: an interval of 0 or less, PATH a model repository, another
            model control mode, or ``--load-model``.
    """
    from hloserve.errors import InvalidArgumentError

    if not interval_s > 0:
        raise InvalidArgumentError(f"--watch-interval must be above 0 seconds, got {interval_s}")
    if path_is_repository:
        raise InvalidArgumentError(
            "--watch needs a bundles directory (PATH is a model repository; serve it with "
            "--model-control-mode poll to follow its changes)"
        )
    if model_control_mode not in (None, "explicit") or load_models:
        raise InvalidArgumentError(
            "--watch loads and unloads models itself through explicit model control: leave "
            "out --model-control-mode and --load-model"
        )
