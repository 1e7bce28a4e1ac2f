"""``hloserve serve BUNDLES --watch``: :class:`BundleWatcher` builds, installs and loads each
settled change of the bundles directory through Triton's repository API (docs/serving.md,
"Watching the bundles directory"); :func:`hloserve.node.serve.watching` runs it in a thread.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hloserve.errors import HloserveError
from hloserve.model_control import RepositoryClient
from hloserve.node.model_control_client import FleetModelControl, error_text

if TYPE_CHECKING:
    from hloserve.bundle.manifest import Manifest
    from hloserve.model_repository_tools.build_options import BuildOptions
    from hloserve.node.tritonserver import TritonServer
    from hloserve.observability.supervisor import NodeObservability

log = logging.getLogger("hloserve.watch")
_print_flushed = functools.partial(print, flush=True)

#: Seconds between two polls of the bundles directory (ReactantServer's default).
DEFAULT_WATCH_INTERVAL_S = 15.0

#: One file of a bundle: (path relative to the bundle, size in bytes, mtime in ns, inode).
FileStamp = tuple[str, int, int, int]
#: A bundle folder's content as the watcher compares it: every file's stamp, sorted by path.
Fingerprint = tuple[FileStamp, ...]


def fingerprint(bundle: Path) -> Fingerprint:
    """The stamps of every file under ``bundle`` (links followed; ``.*`` and ``__pycache__``
    left out, as the build does); a file vanishing while read gets a stamp that never repeats."""
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
    from hloserve.bundle.bundle import discover_bundles

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
    """Which bundles changed and then held still for one poll (ReactantServer's rule): a new
    content (or absence) seen at two polls in a row is reported once and then counts as acted
    on (``acted``: name -> fingerprint), whether acting succeeded or not."""

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
    """``models`` ordered so that every model comes after the models it calls (ties by name);
    ``calls``: meta name -> the models it calls."""
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
    """What the watcher last did to one model (``hloserve status --models``): ``version`` 0 =
    none yet; ``state`` ``READY``, ``FAILED`` (the previous version, if any, keeps serving) or
    ``UNLOADED``; ``last_reload`` UNIX time (s), None = loaded at start."""

    name: str
    version: int = 1
    state: str = "READY"
    last_reload: float | None = None
    error: str = ""


def model_rows(
    index: Sequence[Mapping[str, Any]], records: Sequence[ModelRecord]
) -> list[dict[str, Any]]:
    """``/models`` rows: Triton's repository index (version, state, reason) joined by name
    with the watcher's records (last reload, error); a removed model keeps its record's row."""
    rows: dict[str, dict[str, Any]] = {}
    for entry in index:
        name = str(entry["name"])
        row = rows.get(name)
        if row is not None and row["state"] == "READY":
            continue  # an old version's entry beside the one serving
        fields = {k: str(entry.get(k, "")) for k in ("version", "state", "reason")}
        rows[name] = {"name": name, **fields, "last_reload": None, "error": ""}
    for record in records:
        row = rows.setdefault(
            record.name, {"name": record.name, "version": "", "state": record.state, "reason": ""}
        )
        row["last_reload"] = record.last_reload
        row["error"] = record.error
    return [rows[n] for n in sorted(rows)]


def model_versions(model_dir: Path) -> list[int]:
    """The Triton version numbers (numeric subfolders) of a model folder, ascending."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit() and p.is_dir())


@dataclass(frozen=True)
class Installed:
    """A model version moved into the repository (:func:`roll_back` undoes it);
    ``previous_config``: the config.pbtxt text it replaced, None for a new model."""

    model_dir: Path
    version: int
    previous_config: str | None


def install_version(staged: Path, repository: Path, name: str) -> Installed:
    """Move a model folder built by ``write_repository`` (version 1, on the repository's file
    system) into ``repository``: a new model as is, else as version N+1 with ``config.pbtxt``'s
    ``hloserve.bundle`` at ``N+1/bundle``."""
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
    """Refuse ``--watch`` settings other than explicit mode serving a bundles directory; raises
    InvalidArgumentError: an interval <= 0, PATH a repository, another mode, --load-model."""
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


class ModelControl(Protocol):
    """Triton's repository API as the watcher uses it
    (:class:`~hloserve.model_control.RepositoryClient`)."""

    def load(self, model: str) -> None:
        """Load or reload ``model`` from the repository; raises when it fails."""

    def reload(self, model: str) -> None:
        """Load ``model`` again though no file changed (fresh instances)."""

    def unload(self, model: str) -> None:
        """Unload ``model`` and wait until it is unloaded."""


@dataclass
class BundleWatcher:
    """Polls a bundles directory and brings a repository and its server in line with it;
    ``acted``: a :func:`scan` taken before the build (a change during it is seen), ``build``:
    the repository's build options (None: every default), ``report``: a line per event."""

    bundles_dir: Path
    repository: Path
    control: ModelControl
    acted: Mapping[str, Fingerprint]
    build: BuildOptions | None = None
    interval_s: float = DEFAULT_WATCH_INTERVAL_S
    report: Callable[[str], None] = _print_flushed

    def __post_init__(self) -> None:
        from hloserve.bundle.bundle import load_bundle

        self._debounce = Debouncer(self.acted)
        self._records = {n: ModelRecord(n) for n in self.acted}
        self._lock = threading.Lock()
        self._calls: dict[str, tuple[str, ...]] = {}
        self._kinds: dict[str, str] = {}
        for name in self.acted:
            self._remember(name, load_bundle(self._served_copy(name)).manifest)

    def _remember(self, name: str, manifest: Manifest) -> None:
        self._kinds[name] = manifest.kind
        self._calls.pop(name, None)
        if manifest.is_meta:
            self._calls[name] = tuple(manifest.calls)

    def run(self, stop: threading.Event) -> None:
        """Poll every ``interval_s`` until ``stop`` is set; a failed round is reported."""
        while not stop.wait(self.interval_s):
            try:
                self.poll_once()
            except Exception as exc:  # the watcher keeps watching
                log.exception("watch round failed")
                self.report(f"hloserve: watch: round failed: {error_text(exc)}")

    def poll_once(self) -> Changes:
        """One poll: scan, and act on the changes that settled."""
        try:
            current = scan(self.bundles_dir)
        except HloserveError as exc:  # the directory itself went away
            self.report(f"hloserve: watch: {exc.message}")
            return Changes()
        changes = self._debounce.poll(current)
        for name in dependency_order(changes.removed, self._calls)[::-1]:  # callers first
            self._safely(self._remove, name)
        wanted = {*changes.added, *changes.changed}
        calls = {**self._calls, **self._source_calls(wanted)}
        reloaded: list[str] = []
        for name in dependency_order(wanted, calls):
            if self._safely(self._install, name):
                reloaded.append(name)
        # a meta refused for want of a callee is tried again once the callee serves
        waiting = self._source_calls(
            n for n, r in self._records.items() if r.state == "FAILED" and n not in wanted
        )
        for meta in dependency_order(callers(reloaded, waiting), waiting):
            if meta in current and self._safely(self._install, meta):
                reloaded.append(meta)
        for meta in dependency_order(callers(reloaded, self._calls) - set(reloaded), self._calls):
            self._safely(self._reload_caller, meta)
        return changes

    def _safely(self, action: Callable[[str], bool | None], name: str) -> bool:
        """``action(name)``; an unexpected error fails that model's change only."""
        try:
            return bool(action(name))
        except Exception as exc:
            log.exception("watch: model %r", name)
            self._fail(name, "change", f"{type(exc).__name__}: {error_text(exc)}")
            return False

    def _source_calls(self, models: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """What the meta bundles among ``models`` call (a bad manifest: nothing)."""
        manifests = {n: _manifest(self.bundles_dir / n) for n in models}
        return {n: tuple(m.calls) for n, m in manifests.items() if m is not None and m.is_meta}

    def records(self) -> list[ModelRecord]:
        """A copy of every model's record, by name."""
        with self._lock:
            return [ModelRecord(**vars(r)) for _, r in sorted(self._records.items())]

    def _record(self, name: str, **values: Any) -> None:
        """Update ``name``'s record, its ``last_reload`` to now."""
        with self._lock:
            record = self._records.setdefault(name, ModelRecord(name, version=0))
            for key, value in {**values, "last_reload": time.time()}.items():
                setattr(record, key, value)

    def _fail(self, name: str, what: str, error: str) -> None:
        version = self._records[name].version if name in self._records else 0
        keeps = f"version {version} keeps serving" if version else "not served"
        self.report(f"hloserve: watch: model '{name}': {what} failed ({keeps}): {error}")
        self._record(name, state="FAILED", error=error)

    def _remove(self, name: str) -> None:
        loaded = (self.repository / name).is_dir()  # else it never loaded
        if loaded:
            self.report(f"hloserve: watch: model '{name}': bundle removed; unloading")
            if not self._control(name, "unload", self.control.unload):
                return
            shutil.rmtree(self.repository / name, ignore_errors=True)
        self._calls.pop(name, None)
        self._kinds.pop(name, None)
        if loaded or name in self._records:
            self._record(name, state="UNLOADED", version=0, error="")
        if loaded:
            self.report(f"hloserve: watch: model '{name}': unloaded")

    def _control(self, name: str, what: str, action: Callable[[str], None]) -> bool:
        """``action(name)`` on the server's repository API; a failure is the model's."""
        try:
            action(name)
        except Exception as exc:
            self._fail(name, what, error_text(exc))
            return False
        return True

    def _install(self, name: str) -> bool:
        """Validate, build, move in and load bundle ``name``; whether it now serves."""
        from hloserve.bundle.validate import check_bundle

        source = self.bundles_dir / name
        kind = getattr(_manifest(source), "kind", "model")  # check_bundle reports a bad one
        try:
            bundle = check_bundle(source, models={**self._kinds, name: kind})
        except HloserveError as exc:
            self._fail(name, "validation", exc.message)
            return False
        manifest = bundle.manifest
        needed = {n: self._served_copy(n) for n in manifest.calls if n in self._kinds}
        staging = Path(tempfile.mkdtemp(prefix=f".{self.repository.name}.watch-",
                                        dir=self.repository.parent))  # fmt: skip
        try:
            try:
                staged = self._stage(name, source, needed, staging)
            except HloserveError as exc:
                self._fail(name, "build", exc.message)
                return False
            if fingerprint(source) != self._debounce.acted.get(name):
                self.report(f"hloserve: watch: model '{name}': changed while being built; retrying")
                self._debounce.acted[name] = ()  # differs from any content: acted on again
                return False
            installed = install_version(staged, self.repository, name)
            what = "loading" if installed.previous_config is None else "reloading"
            self.report(f"hloserve: watch: model '{name}': {what} version {installed.version}")
            started = time.monotonic()
            if not self._control(name, f"load of version {installed.version}", self.control.load):
                roll_back(installed)
                return False
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        prune_versions(self.repository / name, keep_from=installed.version - 1)
        self._remember(name, manifest)
        self._record(name, version=installed.version, state="READY", error="")
        self.report(
            f"hloserve: watch: model '{name}': version {installed.version} READY "
            f"({time.monotonic() - started:.1f} s)"
        )
        return True

    def _stage(self, name: str, source: Path, needed: Mapping[str, Path], staging: Path) -> Path:
        """Build model ``name`` alone (its callees beside it) in ``staging``; its folder."""
        from hloserve.model_repository_tools.build import write_repository
        from hloserve.model_repository_tools.repository_plan import RepositoryPlan, plan_repository

        links = staging / "bundles"
        links.mkdir()
        for other, path in {**needed, name: source}.items():
            (links / other).symlink_to(path.absolute(), target_is_directory=True)
        plan = plan_repository(links, _options_for(self.build, {name, *needed}))
        only = RepositoryPlan(
            tuple(m for m in plan.models if m.name == name), plan.runtime_config_text
        )
        write_repository(only, staging / "repository")
        return staging / "repository" / name

    def _reload_caller(self, meta: str) -> None:
        self.report(f"hloserve: watch: meta model '{meta}': reloading after its callees")
        if self._control(meta, "reload", self.control.reload):
            self._record(meta, state="READY", error="")
            self.report(f"hloserve: watch: meta model '{meta}': reloaded")

    def _served_copy(self, name: str) -> Path:
        """The bundle copy that model ``name``'s current version serves."""
        from hloserve import names

        versions = model_versions(self.repository / name)
        leaf = Path(names.BUNDLE_SUBDIR).name
        return self.repository / name / str(max(versions, default=1)) / leaf


def _manifest(bundle: Path) -> Manifest | None:
    from hloserve.bundle.bundle import load_bundle

    try:
        return load_bundle(bundle).manifest
    except HloserveError:
        return None


def _options_for(build: BuildOptions | None, models: set[str]) -> BuildOptions:
    """``build`` with its per-model settings cut down to ``models`` (a watch never rewrites
    the runtime's config they shape)."""
    from dataclasses import replace

    from hloserve.model_repository_tools.build_options import BuildOptions

    def only(per_model: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in per_model.items() if k in models}

    build = build or BuildOptions()
    cache, sched, queue = build.weight_cache, build.scheduling, build.queue
    return replace(
        build,
        weight_cache=replace(cache, residency=only(cache.residency)),
        scheduling=replace(sched, model_weights=only(sched.model_weights)),
        queue=replace(queue, per_model=only(queue.per_model)),
    )


def server_model_control(
    servers: Sequence[TritonServer], timeout_s: float
) -> RepositoryClient | FleetModelControl:
    """One server's :class:`~hloserve.model_control.RepositoryClient`, or a
    :class:`FleetModelControl` over several; ``timeout_s`` bounds each call."""
    controls = [
        RepositoryClient(s.urls.http, s.options.model_control_key, timeout_s) for s in servers
    ]
    if len(controls) == 1:
        return controls[0]
    return FleetModelControl(controls, lambda i: servers[i].is_running())


def serve_model_list(
    observe: NodeObservability,
    control: RepositoryClient | FleetModelControl,
    watcher: BundleWatcher | None = None,
) -> None:
    """Answer the admin port's ``/models`` with :func:`model_rows` (records from ``watcher``)."""
    observe.serve_models(
        lambda: model_rows(control.index(), watcher.records() if watcher is not None else [])
    )
