"""``hloserve serve``: build a repository from bundles if needed, run its node with the
supervisor of ``node up``, stop cleanly (docs/serving.md).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from hloserve.errors import NotFoundError
from hloserve.node import serve_options
from hloserve.node.serve_options import ServeOptions
from hloserve.node.supervisor import Node, run_node, stop_on_signals

if TYPE_CHECKING:
    from hloserve.node.watcher import BundleWatcher, Fingerprint
    from hloserve.observability.supervisor import NodeObservability

log = logging.getLogger("hloserve.serve")


@contextlib.contextmanager
def prepared_repository(options: ServeOptions) -> Iterator[Path]:
    """The model repository to serve: PATH itself, or PATH's bundles built into one; raises
    NotFoundError: PATH does not exist or holds neither bundles nor models; BundleError: a bundle
    is invalid (nothing is built)."""
    path = options.path
    if not path.is_dir():
        raise NotFoundError(f"{path}: no such directory")
    if serve_options.is_repository(path):
        yield path
        return
    from hloserve.bundle.bundle import discover_bundles
    from hloserve.bundle.manifest import MANIFEST_FILE

    if (path / MANIFEST_FILE).is_file():
        raise NotFoundError(
            f"{path}: a bundle, not a bundles directory; serve the directory that holds it "
            f"({path.parent})"
        )
    if not discover_bundles(path):
        raise NotFoundError(
            f"{path}: neither a bundles directory (no */manifest.yaml) "
            "nor a model repository (no */config.pbtxt)"
        )
    from hloserve.model_repository_tools.build import build_repository

    scratch: Path | None = None
    if options.repository_out is None:
        scratch = Path(tempfile.mkdtemp(prefix="hloserve-repository-"))
        out = scratch / "repository"
    else:
        out = options.repository_out  # build_repository replaces only its own repositories
    try:
        log.info("building the model repository from bundles in %s into %s", path, out)
        build_repository(path, out, options.build, overwrite=True)
        yield out
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def watching(
    options: ServeOptions,
    repository: Path,
    acted: Mapping[str, Fingerprint],
    node: Node,
    observe: NodeObservability,
) -> Iterator[BundleWatcher]:
    """Run the :class:`~hloserve.node.watcher.BundleWatcher` of ``serve --watch`` over
    ``node``'s servers in a thread until the block ends, ``/models`` answering with
    :func:`~hloserve.node.watcher.model_rows`."""
    from hloserve.node.watcher import BundleWatcher, serve_model_list, server_model_control

    o = options
    control = server_model_control(node.servers, o.startup_timeout_s)  # bounds one load
    watcher = BundleWatcher(o.path, repository, control, acted, o.build, o.watch_interval_s)
    serve_model_list(observe, control, watcher)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), name="hloserve-watch", daemon=True)
    thread.start()
    print(
        f"  watching {o.path} every {o.watch_interval_s:g} s "
        "(a change is acted on once two polls see it)",
        flush=True,
    )
    try:
        yield watcher
    finally:
        stop.set()
        thread.join(10.0)  # a load in flight ends with the server


def run_serve(options: ServeOptions) -> int:
    """Serve until Ctrl-C or SIGTERM (exit 0) or until every worker is down for good (exit 1);
    raises HloserveError: bad options, the repository cannot be prepared, or a worker cannot
    start."""
    gpus = serve_options.serve_gpus(options)
    serve_options.check_options(options, gpus)
    stop = threading.Event()
    with stop_on_signals(stop, "hloserve"):
        watched = None
        if options.watch:  # before the build: a change made during it is acted on later
            from hloserve.node.watcher import scan

            watched = scan(options.path)
        with prepared_repository(options) as repository:
            if stop.is_set():  # Ctrl-C while the repository was being built
                return 0
            plan = serve_options.serve_plan(options, repository, gpus)
            print(f"hloserve: {len(gpus)} tritonserver(s) serving {repository}", flush=True)
            serving = None if watched is None else partial(watching, options, repository, watched)

            return run_node(plan, stop, serving=serving)
