"""``hloserve gateway-ctl``: one ``GatewayControl`` RPC per subcommand (docs/gateway.md,
"hloserve gateway-ctl"); grpc and rich are imported by the actions only (a cheap parser).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from hloserve.errors import HloserveError, InvalidArgumentError, Status
from hloserve.gateway.config import KNOBS, SchedulingConfig
from hloserve.units import format_bytes


def parse_replicas(text: str, what: str) -> int | str:
    """``"all"`` or a positive integer from the command line.

    Raises:
        InvalidArgumentError: anything else.
    """
    if text == "all":
        return "all"
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgumentError(
            f"{what}: expected a positive integer or 'all', got {text!r}"
        ) from None
    if value < 1:
        raise InvalidArgumentError(f"{what}: expected a positive integer or 'all', got {value}")
    return value


def parse_knob(name: str, text: str) -> Any:
    """The typed value of knob ``name`` from its command-line text (range checks: server).

    Raises:
        InvalidArgumentError: unknown knob, or text of the wrong type for it.
    """
    if name not in KNOBS:
        raise InvalidArgumentError(f"unknown knob {name!r}; known: {', '.join(KNOBS)}")
    if name == "default_replicas":
        return parse_replicas(text, name)
    if name == "forbid_memory_oversubscription":
        value = yaml.safe_load(text)
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"{name}: expected true or false, got {text!r}")
        return value
    if SchedulingConfig.model_fields[name].annotation is float:
        try:
            return float(text)
        except ValueError:
            raise InvalidArgumentError(f"{name}: expected a number, got {text!r}") from None
    return text


def _replicas_text(message: Any) -> str:
    return "all" if message.WhichOneof("value") == "all" else str(message.count)


def _knob_text(knobs: Any, name: str) -> str:
    value = getattr(knobs, name)
    if name == "default_replicas":
        return _replicas_text(value)
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def render_status(status: Any) -> list[Any]:
    """Rich renderables of a ``SchedulingStatus`` (cells never wrap: see :func:`print_status`)."""
    from rich.table import Table

    out: list[Any] = [f"mode: [bold]{status.mode}[/bold]"]
    knobs = Table(title="knobs", show_header=False)
    knobs.add_column(no_wrap=True)
    knobs.add_column(no_wrap=True)
    for name in KNOBS:
        knobs.add_row(name, _knob_text(status.knobs, name))
    out.append(knobs)
    models = Table(title="models")
    models.add_column("model", no_wrap=True)
    for column in ("replicas", "fill", "quantum", "rate/s", "cost ms", "weights"):
        models.add_column(column, justify="right", no_wrap=True)
    models.add_column("placement", no_wrap=True)  # one replica per line
    for m in status.models:
        placement = "\n".join(
            f"{r.worker} (routed {r.routed_total}, in flight {r.outstanding_items})"
            for r in m.replicas
        )
        models.add_row(
            m.name,
            f"{m.effective_replicas}/{_replicas_text(m.configured_replicas)}",
            f"{m.fill_mode} x{m.fill_factor:g}",
            str(m.fill_quantum or "-"),
            f"{m.arrival_rate:.1f}",
            f"{m.cost_per_item_seconds * 1e3:.3f}",
            format_bytes(m.weight_bytes) if m.weight_bytes else "-",
            placement or "-",
        )
    out.append(models)
    workers = Table(title="workers")
    workers.add_column("worker", no_wrap=True)
    for column in ("models", "in flight", "compute", "weights", "budget", "pressure"):
        workers.add_column(column, justify="right", no_wrap=True)
    for w in status.workers:
        workers.add_row(
            w.worker,
            str(w.models_placed),
            str(w.outstanding_items),
            f"{w.compute_share:.3f}",
            format_bytes(w.weight_bytes),
            format_bytes(w.weight_budget_bytes) if w.weight_budget_bytes else "-",
            f"{w.pressure:.3f}",
        )
    out.append(workers)
    if status.HasField("repack"):
        r = status.repack
        out.append(
            f"repacks: {r.repacks}; next after {r.budget_compute_seconds:g} fleet compute-s"
            f" ({r.accumulated_compute_seconds:.3f} s so far); last moved:"
            f" {', '.join(r.moved) or 'none'}"
        )
    out.extend(f"[yellow]warning:[/yellow] {w}" for w in status.warnings)
    return out


def print_status(console: Any, renderables: list[Any]) -> None:
    """Print :func:`render_status`'s output uncut: a table wider than the console at its width."""
    from rich.measure import Measurement
    from rich.table import Table

    for renderable in renderables:
        width = console.width
        if isinstance(renderable, Table):
            natural = Measurement.get(console, console.options.update_width(10_000), renderable)
            if natural.maximum > width:
                console.width = natural.maximum  # console.print(width=) cannot exceed it
        try:
            console.print(renderable, crop=False)
        finally:
            console.width = width


def _credentials(args: argparse.Namespace) -> Any:
    """gRPC channel credentials from ``--tls-ca``/``--tls-cert``/``--tls-key``; None: plaintext."""
    import grpc

    files = (args.tls_ca, args.tls_cert, args.tls_key)
    if not any(files):
        return None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidArgumentError("gateway-ctl: --tls-cert and --tls-key go together")
    try:
        ca, cert, key = (f.read_bytes() if f is not None else None for f in files)
    except OSError as exc:
        raise InvalidArgumentError(
            f"gateway-ctl: cannot read {exc.filename}: {exc.strerror}"
        ) from None
    return grpc.ssl_channel_credentials(ca, key, cert)


def _call(args: argparse.Namespace, method: str, request: Any) -> Any:
    """One unary RPC to ``--address``; gRPC errors become HloserveError with the same status."""
    import grpc

    from hloserve.gateway.auth import read_token
    from hloserve.gateway.config import GrpcLimits
    from hloserve.gateway.upstreams import channel_options
    from hloserve.protos import gateway_control_pb2_grpc as pb_grpc

    address, token, credentials = args.address, read_token(args.token_file), _credentials(args)
    limits = channel_options(GrpcLimits())
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    channel = (
        grpc.insecure_channel(address, options=limits)
        if credentials is None
        else grpc.secure_channel(address, credentials, options=limits)
    )
    with channel:
        stub = pb_grpc.GatewayControlStub(channel)
        try:
            return getattr(stub, method)(request, timeout=args.timeout, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code()
            status = Status.__members__.get(code.name, Status.INTERNAL)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                detail = f"gateway {address} not reachable: {exc.details()}"
            elif code == grpc.StatusCode.UNIMPLEMENTED:
                detail = (
                    f"{address} does not serve the hloserve gateway control plane (is it a"
                    " tritonserver port? use the gateway's gRPC port)"
                )
            else:
                detail = exc.details() or code.name
            raise HloserveError(detail, status=status) from None


def run(args: argparse.Namespace, console: Any = None) -> int:
    """Run one ``gateway-ctl`` action on ``console`` (None: stdout); errors raise HloserveError."""
    from rich.console import Console

    from hloserve.gateway.control import replicas_to_proto
    from hloserve.protos import gateway_control_pb2 as pb

    console = console or Console()
    call = functools.partial(_call, args)
    action = args.ctl_action
    if action == "status":
        print_status(
            console, render_status(call("GetSchedulingStatus", pb.GetSchedulingStatusRequest()))
        )
    elif action == "set-replicas":
        replicas = parse_replicas(args.replicas, "replicas")
        row = call(
            "SetModelReplicas",
            pb.SetModelReplicasRequest(model=args.model, replicas=replicas_to_proto(replicas)),
        )
        console.print(
            f"{row.name}: replicas {_replicas_text(row.configured_replicas)} (now on"
            f" {row.effective_replicas}; takes effect at the next repack:"
            " `hloserve gateway-ctl repack`)"
        )
    elif action == "set-fill-mode":
        row = call(
            "SetModelFillMode", pb.SetModelFillModeRequest(model=args.model, fill_mode=args.mode)
        )
        console.print(f"{row.name}: fill mode {row.fill_mode} (quantum {row.fill_quantum or '-'})")
    elif action == "set":
        value = parse_knob(args.knob, args.value)
        request = pb.Knobs()  # only the named field present: the others stay as they are
        if args.knob == "default_replicas":
            request.default_replicas.CopyFrom(replicas_to_proto(value))
        else:
            setattr(request, args.knob, value)
        reply = call("SetKnobs", pb.SetKnobsRequest(knobs=request))
        console.print(f"{args.knob} = {_knob_text(reply.knobs, args.knob)}")
    elif action == "repack":
        reply = call("Repack", pb.RepackRequest())
        console.print(
            f"repacked (repack #{reply.repack.repacks}); moved:"
            f" {', '.join(reply.repack.moved) or 'none'}"
        )
        for warning in reply.warnings:
            console.print(f"[yellow]warning:[/yellow] {warning}")
    return 0


def add_parser(commands: argparse._SubParsersAction, func: Callable[..., int]) -> None:
    """Register ``gateway-ctl`` and its actions on the ``hloserve`` subcommand parser."""
    ctl = commands.add_parser(
        "gateway-ctl",
        help="read and change a running gateway's scheduling (docs/gateway.md)",
        description="Client of the gateway's control plane (hloserve.gateway.v1.GatewayControl "
        "on its gRPC port). Changes are live and not persisted. Mutations need mode "
        "lpt_packing.",
    )
    ctl.add_argument(
        "--address",
        default="127.0.0.1:8001",
        metavar="HOST:PORT",
        help="the gateway's gRPC endpoint (127.0.0.1:8001)",
    )
    ctl.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per call (10)")
    ctl.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="file holding the control token (default: HLOSERVE_CONTROL_TOKEN, else the file"
        " HLOSERVE_CONTROL_TOKEN_FILE names)",
    )
    ctl.add_argument("--tls-ca", type=Path, metavar="PEM", help="TLS: the gateway's CA")
    ctl.add_argument("--tls-cert", type=Path, metavar="PEM", help="TLS: client certificate")
    ctl.add_argument("--tls-key", type=Path, metavar="PEM", help="TLS: its private key")
    actions = ctl.add_subparsers(dest="ctl_action", required=True, metavar="ACTION")
    actions.add_parser("status", help="mode, knobs, placement per model, worker pressure")
    replicas = actions.add_parser(
        "set-replicas", help="set a model's replica count (effective at the next repack)"
    )
    replicas.add_argument("model", metavar="MODEL")
    replicas.add_argument("replicas", metavar="N", help="a positive integer or 'all'")
    fill = actions.add_parser("set-fill-mode", help="set a model's fill mode (run or spread)")
    fill.add_argument("model", metavar="MODEL")
    fill.add_argument("mode", choices=("run", "spread"), metavar="run|spread")
    knob = actions.add_parser("set", help=f"change a knob: {', '.join(KNOBS)}")
    knob.add_argument("knob", metavar="KNOB", choices=KNOBS)
    knob.add_argument("value", metavar="VALUE")
    actions.add_parser("repack", help="repack now with the current estimates")
    ctl.set_defaults(func=func)
