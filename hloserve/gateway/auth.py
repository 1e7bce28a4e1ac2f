"""Who may call the gateway's control plane: a bearer token or a verified client certificate.

Control calls (``GatewayControl``, model load and unload over gRPC and HTTP) pass with the
control token (:func:`read_token`), the secret HAProxy sets in :data:`CERT_HEADER` for a
verified client certificate, or, for model control only, the workers' model-control key;
otherwise UNAUTHENTICATED (docs/gateway.md, "Control plane: authentication"). With
``auth.open_repository_api`` model control needs none.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from hloserve.errors import HloserveError, InvalidArgumentError, Status
from hloserve.model_control import GRPC_METADATA_KEY, HEADER

#: The control token itself (read by the gateway and by ``hloserve gateway-ctl``).
ENV_TOKEN = "HLOSERVE_CONTROL_TOKEN"
#: A file holding the control token (its first line), when :data:`ENV_TOKEN` is unset.
ENV_TOKEN_FILE = "HLOSERVE_CONTROL_TOKEN_FILE"
#: The header HAProxy sets on requests of a TLS connection with a verified client certificate.
CERT_HEADER = "x-hloserve-client-cert"
#: gRPC methods that need a credential: the control service, and model control.
CONTROL_SERVICE_PREFIX = "/hloserve.gateway.v1.GatewayControl/"
MODEL_CONTROL_METHODS = frozenset(
    {
        "/inference.GRPCInferenceService/RepositoryModelLoad",
        "/inference.GRPCInferenceService/RepositoryModelUnload",
    }
)


def read_token(path: Path | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The control token: the first line of ``path``, else :data:`ENV_TOKEN`, else the first line
    of the file :data:`ENV_TOKEN_FILE` names, else None.

    Raises:
        InvalidArgumentError: the file cannot be read, or the token is under 16 characters.
    """
    env = os.environ if environ is None else environ
    where, token = "", None
    if path is None and env.get(ENV_TOKEN):
        where, token = ENV_TOKEN, env[ENV_TOKEN].strip()
    else:
        path = path or (Path(env[ENV_TOKEN_FILE]) if env.get(ENV_TOKEN_FILE) else None)
        if path is None:
            return None
        where = str(path)
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise InvalidArgumentError(
                f"control token file {path}: cannot read it: {exc.strerror}"
            ) from None
        token = lines[0].strip() if lines else ""
    if len(token) < 16:
        raise InvalidArgumentError(
            f"control token ({where}): expected at least 16 characters, got {len(token)}"
        )
    return token


@dataclass(frozen=True)
class ControlAuth:
    """The credentials a gateway accepts on its control calls (each None: not a credential).

    Attributes:
        cert_secret: the value HAProxy gives :data:`CERT_HEADER` for a verified certificate.
        open_repository_api: model control needs no credential (``auth.open_repository_api``).
    """

    token: str | None = field(default=None, repr=False)
    cert_secret: str | None = field(default=None, repr=False)
    model_control_key: str | None = field(default=None, repr=False)
    open_repository_api: bool = False

    def check(self, headers: Mapping[str, str], model_control: bool) -> None:
        """Accept a call with these ``headers`` (names lower-case), or raise; ``model_control``: a
        model load or unload (the model-control key counts too; with ``open_repository_api``
        nothing is needed).

        Raises:
            HloserveError: UNAUTHENTICATED, naming what to send.
        """

        def equal(value: str | None, expected: str | None) -> bool:
            return bool(value and expected) and hmac.compare_digest(
                str(value).encode(), str(expected).encode()
            )

        if model_control and self.open_repository_api:
            return
        scheme, _, bearer = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and equal(bearer.strip(), self.token):
            return
        if equal(headers.get(CERT_HEADER), self.cert_secret):
            return
        if model_control and (
            equal(headers.get(HEADER), self.model_control_key)
            or equal(headers.get(GRPC_METADATA_KEY), self.model_control_key)
        ):
            return
        ways = []
        if self.token is not None:
            ways.append("'authorization: Bearer <control token>'")
        if self.cert_secret is not None:
            ways.append("a client certificate signed by tls.client_ca")
        if model_control and self.model_control_key is not None:
            ways.append(f"the workers' model-control key ({HEADER})")
        what = "model control" if model_control else "the gateway control plane"
        hint = (
            " or ".join(ways)
            if ways
            else f"nothing: the gateway has no control token ({ENV_TOKEN}, {ENV_TOKEN_FILE}"
            " or auth.token_file) and no tls.client_ca"
        )
        raise HloserveError(
            f"{what} needs a credential; send {hint}", status=Status.UNAUTHENTICATED
        )


def _protected(method: str) -> bool | None:
    """None: open; else whether ``method`` is model control."""
    if method.startswith(CONTROL_SERVICE_PREFIX):
        return False
    return True if method in MODEL_CONTROL_METHODS else None


def _metadata(pairs: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in pairs or () if not str(k).endswith("-bin")}


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a control call without a credential: UNAUTHENTICATED."""

    def __init__(self, auth: ControlAuth) -> None:
        self._auth = auth

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The method's own handler, or one answering UNAUTHENTICATED."""
        model_control = _protected(handler_call_details.method)
        if model_control is not None:
            try:
                self._auth.check(_metadata(handler_call_details.invocation_metadata), model_control)
            except HloserveError as exc:
                message = exc.message

                async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

                return grpc.unary_unary_rpc_method_handler(refuse)
        return await continuation(handler_call_details)
