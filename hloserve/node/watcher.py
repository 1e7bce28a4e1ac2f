"""The watcher of ``hloserve serve BUNDLES --watch``: polls, builds and loads (docs/serving.md,
"Watching the bundles directory").

:mod:`hloserve.node.watch` holds the rules (fingerprints, debounce, dependency order, version
folders); this module applies them to a running tritonserver through its repository API
(:class:`TritonModelControl`, with the model-control key of :mod:`hloserve.model_control`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hloserve.errors import HloserveError
from hloserve.node.model_control_client import FleetModelControl, TritonModelControl, error_text
from hloserve.node.watch import (
    DEFAULT_WATCH_INTERVAL_S,
    Changes,
    Debouncer,
    Fingerprint,
    ModelRecord,
    callers,
    dependency_order,
    fingerprint,
    install_version,
    model_rows,
    model_versions,
    prune_versions,
    roll_back,
    scan,
)

if TYPE_CHECKING:
    from hloserve.node.tritonserver import TritonServer
    from hloserve.observability.supervisor import NodeObservability

log = logging.getLogger("hloserve.watch")


class ModelControl(Protocol):
    """Triton's repository API as the watcher uses it (:class:`TritonModelControl`)."""

    def load(self, model: str) -> None:
        """Load or reload ``model`` from the repository; raises when it fails."""

    def reload(self, model: str) -> None:
        """Load ``model`` again though no file changed (fresh instances)."""

    def unload(self, model: str) -> None:
        """Unload ``model`` and wait until it is unloaded."""


@dataclass
class BundleWatcher:
    """Polls a bundles directory and brings a repository and its server in line with it.

    Args:
        bundles_dir: the bundles directory being served.
        repository: the repository built from it (the server's ``--model-repository``).
        control: the server's repository API.
        acted: the content the repository was built from (a :func:`scan` taken before the
            build, so that a change during the build is seen).
        build: keyword arguments of
            :func:`~hloserve.model_repository_tools.build.plan_repository` (front instances,
            queue delay, batch sizes, ...), as the repository was built with.
        interval_s: seconds between polls.
        report: receives one line per event.
    """

    bundles_dir: Path
    repository: Path
    control: ModelControl
    acted: Mapping[str, Fingerprint]
    build: Mapping[str, Any] = field(default_factory=dict)
    interval_s: float = DEFAULT_WATCH_INTERVAL_S
    report: Callable[[str], None] = print

    def __post_init__(self) -> None:
        from hloserve.bundle import load_bundle

        self._debounce = Debouncer(self.acted)
        self._records = {n: ModelRecord(n) for n in self.acted}
        self._lock = threading.Lock()
        self._calls: dict[str, tuple[str, ...]] = {}
        self._kinds: dict[str, str] = {}
        for name in self.acted:
            manifest = load_bundle(self._served_copy(name)).manifest
            self._kinds[name] = manifest.kind
            if manifest.is_meta:
                self._calls[name] = tuple(manifest.calls)

    # -- the loop -----------------------------------------------------------------------------

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
        """``action(name)``; an unexpected error (a file vanishing under the build, a full
        disk) fails that model's change only, reported like any failure."""
        try:
            return bool(action(name))
        except Exception as exc:
            log.exception("watch: model %r", name)
            self._fail(name, "change", f"{type(exc).__name__}: {error_text(exc)}")
            return False

    def _source_calls(self, models: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """What the meta bundles among ``models`` call, from their manifests in the bundles
        directory (a manifest that does not load counts as calling nothing)."""
        from hloserve.bundle import load_bundle

        found = {}
        for name in models:
            try:
                manifest = load_bundle(self.bundles_dir / name).manifest
            except HloserveError:
                continue
            if manifest.is_meta:
                found[name] = tuple(manifest.calls)
        return found

    def records(self) -> list[ModelRecord]:
        """A copy of every model's record, by name."""
        with self._lock:
            return [ModelRecord(**vars(r)) for _, r in sorted(self._records.items())]

    # -- actions ------------------------------------------------------------------------------

    def _record(self, name: str, **values: Any) -> None:
        with self._lock:
            record = self._records.setdefault(name, ModelRecord(name, version=0))
            for key, value in values.items():
                setattr(record, key, value)

    def _fail(self, name: str, what: str, error: str) -> None:
        version = self._records[name].version if name in self._records else 0
        keeps = f"version {version} keeps serving" if version else "not served"
        self.report(f"hloserve: watch: model '{name}': {what} failed ({keeps}): {error}")
        self._record(name, state="FAILED", error=error, last_reload=time.time())

    def _remove(self, name: str) -> None:
        if not (self.repository / name).is_dir():  # it never loaded
            self._forget(name)
            if name in self._records:
                self._record(name, state="UNLOADED", version=0, error="", last_reload=time.time())
            return
        self.report(f"hloserve: watch: model '{name}': bundle removed; unloading")
        try:
            self.control.unload(name)
        except Exception as exc:
            self._fail(name, "unload", error_text(exc))
            return
        shutil.rmtree(self.repository / name, ignore_errors=True)
        self._forget(name)
        self._record(name, state="UNLOADED", version=0, error="", last_reload=time.time())
        self.report(f"hloserve: watch: model '{name}': unloaded")

    def _forget(self, name: str) -> None:
        self._calls.pop(name, None)
        self._kinds.pop(name, None)

    def _install(self, name: str) -> bool:
        """Validate, build, move in and load bundle ``name``; whether it now serves."""
        from hloserve.bundle import check_bundle

        source = self.bundles_dir / name
        kinds = {**self._kinds}
        try:
            bundle = check_bundle(source, models={**kinds, name: _kind(source)})
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
            try:
                self.control.load(name)
            except Exception as exc:
                roll_back(installed)
                self._fail(name, f"load of version {installed.version}", error_text(exc))
                return False
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        prune_versions(self.repository / name, keep_from=installed.version - 1)
        self._kinds[name] = manifest.kind
        self._calls.pop(name, None)
        if manifest.is_meta:
            self._calls[name] = tuple(manifest.calls)
        self._record(
            name, version=installed.version, state="READY", error="", last_reload=time.time()
        )
        self.report(
            f"hloserve: watch: model '{name}': version {installed.version} READY "
            f"({time.monotonic() - started:.1f} s)"
        )
        return True

    def _stage(self, name: str, source: Path, needed: Mapping[str, Path], staging: Path) -> Path:
        """Build model ``name`` alone (with its callees beside it to check against) in
        ``staging``; returns the built model folder."""
        from hloserve.model_repository_tools.build import (
            RepositoryPlan,
            plan_repository,
            write_repository,
        )

        links = staging / "bundles"
        links.mkdir()
        for other, path in {**needed, name: source}.items():
            (links / other).symlink_to(path.absolute(), target_is_directory=True)
        plan = plan_repository(links, **_options_for(self.build, {name, *needed}))
        only = RepositoryPlan(
            tuple(m for m in plan.models if m.name == name), plan.runtime_config_text
        )
        write_repository(only, staging / "repository")
        return staging / "repository" / name

    def _reload_caller(self, meta: str) -> None:
        self.report(f"hloserve: watch: meta model '{meta}': reloading after its callees")
        try:
            self.control.reload(meta)
        except Exception as exc:
            self._fail(meta, "reload", error_text(exc))
            return
        self._record(meta, state="READY", error="", last_reload=time.time())
        self.report(f"hloserve: watch: meta model '{meta}': reloaded")

    def _served_copy(self, name: str) -> Path:
        """The bundle copy that model ``name``'s current version serves."""
        from hloserve import names

        versions = model_versions(self.repository / name)
        leaf = Path(names.BUNDLE_SUBDIR).name
        return self.repository / name / str(max(versions, default=1)) / leaf


def _kind(bundle: Path) -> str:
    from hloserve.bundle import load_bundle

    try:
        return load_bundle(bundle).manifest.kind
    except HloserveError:
        return "model"  # check_bundle reports why


def _options_for(build: Mapping[str, Any], models: set[str]) -> dict[str, Any]:
    """``build`` with the per-model settings (residency, scheduling weights, queue bounds) cut
    down to ``models``: they shape the runtime's config, which a watch never rewrites."""
    import dataclasses

    options = dict(build)
    cache = options.get("weight_cache")
    if cache is not None:
        residency = {k: v for k, v in cache.residency.items() if k in models}
        options["weight_cache"] = dataclasses.replace(cache, residency=residency)
    sched = options.get("scheduling")
    if sched is not None:
        weights = {k: v for k, v in sched.model_weights.items() if k in models}
        options["scheduling"] = dataclasses.replace(sched, model_weights=weights)
    queue = options.get("queue")
    if queue is not None:
        sizes = {k: v for k, v in queue.per_model.items() if k in models}
        options["queue"] = dataclasses.replace(queue, per_model=sizes)
    return options


@contextlib.contextmanager
def watching(
    bundles_dir: Path,
    repository: Path,
    servers: Sequence[TritonServer],
    observe: NodeObservability,
    acted: Mapping[str, Fingerprint],
    *,
    build: Mapping[str, Any],
    interval_s: float,
    timeout_s: float,
) -> Iterator[BundleWatcher]:
    """Run a :class:`BundleWatcher` for ``serve --watch`` in a thread until the block ends;
    the admin port's ``/models`` answers with :func:`model_rows` meanwhile.

    Args:
        bundles_dir, repository, acted, build, interval_s: see :class:`BundleWatcher`.
        servers: the running servers of the repository (their HTTP endpoints and
            model-control keys): one, or the workers of ``serve --workers N``
            (:class:`FleetModelControl`).
        observe: the supervisor's admin port.
        timeout_s: seconds one load may take.
    """
    control = server_model_control(servers, timeout_s)
    watcher = BundleWatcher(
        bundles_dir,
        repository,
        control,
        acted,
        build=build,
        interval_s=interval_s,
        report=lambda line: print(line, flush=True),
    )
    serve_model_list(observe, control, watcher)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), name="hloserve-watch", daemon=True)
    thread.start()
    print(
        f"  watching {bundles_dir} every {interval_s:g} s "
        "(a change is acted on once two polls see it)",
        flush=True,
    )
    try:
        yield watcher
    finally:
        stop.set()
        thread.join(10.0)  # a load in flight ends with the server


def server_model_control(
    servers: Sequence[TritonServer], timeout_s: float
) -> TritonModelControl | FleetModelControl:
    """Model control of running servers of one repository: one server's
    :class:`TritonModelControl`, or a :class:`FleetModelControl` over the workers of ``serve
    --workers N``; ``timeout_s`` bounds each call."""
    controls = [
        TritonModelControl(s.urls.http, s.options.model_control_key, timeout_s) for s in servers
    ]
    if len(controls) == 1:
        return controls[0]
    return FleetModelControl(controls, lambda i: servers[i].is_running())


def serve_model_list(
    observe: NodeObservability,
    control: TritonModelControl | FleetModelControl,
    watcher: BundleWatcher | None = None,
) -> None:
    """Answer the admin port's ``/models`` with :func:`~hloserve.node.watch.model_rows` of the
    server's repository index and, with ``--watch``, the watcher's records."""
    observe.serve_models(
        lambda: model_rows(control.index(), watcher.records() if watcher is not None else [])
    )
