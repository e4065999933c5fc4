"""A small typed client for the gateway's HTTP API (used by the control plane and the tests)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import httpx

from contract.runtime_http import CALL_ID_HEADER
from gateway.models import AFFINITY_HEADER, METER_HEADER, Activation, FunctionSpec, Status


class GatewayError(RuntimeError):
    """A non-2xx answer; `status_code` and the gateway's `error` body are kept."""

    def __init__(self, status_code: int, error: dict[str, Any], headers: httpx.Headers | None = None) -> None:
        super().__init__(f"{status_code} {error.get('type', 'Error')}: {error.get('message', '')}")
        self.status_code = status_code
        self.error = error
        self.headers = headers


class Recovered(NamedTuple):
    """Where the gateway is after a recovery, and how many times it has been replaced by a new process so far (a
    given gateway that came back by itself is not counted: whether it is the same process is not known here)."""

    url: str
    replaced: int


class GatewayClient:
    """`on_unreachable`, when given, is called when the gateway cannot be reached or drops a connection (a crash):
    it brings the gateway back (or waits for it) and says where it is (`Recovered`). A registry or pre-warm request
    is then sent again; an invocation raises a 502, like an instance that died, for the caller to call again (its
    handler may have run partly): `GatewayRestarted` when the gateway that held the call was replaced since it was
    sent, else `GatewayUnreachable`. Without it, the transport error is raised as it is."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 120.0,
        on_unreachable: Callable[[], Recovered] | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)
        self.on_unreachable = on_unreachable
        self._recovering = threading.Lock()
        self.replaced = 0  # of the gateway now at base_url (`Recovered.replaced`)

    def _send(self, method: str, url: str, *, invocation: bool = False, **kwargs: Any) -> httpx.Response:
        sent_to = self.replaced
        try:
            return self.http.request(method, url, **kwargs)
        except httpx.TimeoutException:
            raise  # the gateway is there but slow: not a crash
        except httpx.TransportError as exc:
            if self.on_unreachable is None:
                raise
            with self._recovering:  # one recovery at a time; later callers find the gateway back
                back = self.on_unreachable()
                self.http.base_url, self.replaced = httpx.URL(back.url), back.replaced
            if invocation:
                what = f"({type(exc).__name__}: {exc})"
                if back.replaced > sent_to:  # another caller's recovery may have replaced it: counted, not seen
                    message = f"the gateway that held the call died {what}; a new one was started"
                    raise GatewayError(502, {"type": "GatewayRestarted", "message": message}) from exc
                message = f"the gateway went away during the call {what}; it is back"
                raise GatewayError(502, {"type": "GatewayUnreachable", "message": message}) from exc
            return self.http.request(method, url, **kwargs)

    def _check(self, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            try:
                body = resp.json()
                error = body.get("error", body) if isinstance(body, dict) else {"message": str(body)}
            except ValueError:
                error = {"type": "HTTPError", "message": resp.text}
            raise GatewayError(resp.status_code, error, resp.headers)
        return resp.json()

    # -- registry ---------------------------------------------------------------------------------------------
    def register(self, spec: FunctionSpec, *, replace: bool = False) -> dict[str, Any]:
        body = spec.model_dump(mode="json")
        if replace:
            return self._check(self._send("PUT", f"/system/functions/{spec.name}", json=body))
        return self._check(self._send("POST", "/system/functions", json=body))

    def function(self, name: str) -> dict[str, Any]:
        return self._check(self._send("GET", f"/system/functions/{name}"))

    def functions(self) -> list[dict[str, Any]]:
        return self._check(self._send("GET", "/system/functions"))

    def delete(self, name: str) -> dict[str, Any]:
        return self._check(self._send("DELETE", f"/system/functions/{name}"))

    def prewarm(self, name: str, count: int, *, by_s: float | None = None, wait_s: float = 0.0) -> dict[str, Any]:
        body = {"count": count, "by_s": by_s, "wait_s": wait_s}
        return self._check(self._send("POST", f"/system/functions/{name}/prewarm", json=body))

    # -- invocation -------------------------------------------------------------------------------------------
    def invoke(self, name: str, event: dict[str, Any], *, affinity: str | None = None) -> dict[str, Any]:
        """Synchronous call; returns the handler's result or raises GatewayError (429, 502, 504, ...). `affinity`:
        reuse the instance that last served this key when it is idle (its state between calls is there)."""
        return self._check(self._send("POST", f"/function/{name}", invocation=True, json=event, **_keyed(affinity)))

    def invoke_with_id(self, name: str, event: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        resp = self._send("POST", f"/function/{name}", invocation=True, json=event)
        return resp.headers.get(CALL_ID_HEADER, ""), self._check(resp)

    def invoke_metered(
        self, name: str, event: dict[str, Any], *, affinity: str | None = None
    ) -> tuple[dict[str, Any], Activation]:
        """Synchronous call returning (result, the activation's metering: times, cold, cost; no result copy)."""
        resp = self._send("POST", f"/function/{name}", invocation=True, json=event, **_keyed(affinity))
        result = self._check(resp)
        meter = json.loads(resp.headers.get(METER_HEADER, "{}"))
        act = Activation(id=resp.headers.get(CALL_ID_HEADER, ""), function=name, status=Status.SUCCESS, **meter)
        return result, act

    def invoke_async(self, name: str, event: dict[str, Any]) -> str:
        resp = self._send("POST", f"/async-function/{name}", invocation=True, json=event)
        return str(self._check(resp)["activation_id"])

    def activation(self, activation_id: str, *, wait_s: float = 0.0) -> Activation:
        """The activation record; with wait_s > 0 the gateway holds the request until it ends (long poll)."""
        resp = self._send("GET", f"/activations/{activation_id}", params={"wait_s": wait_s})
        return Activation.model_validate(self._check(resp))

    def metrics(self) -> str:
        resp = self._send("GET", "/metrics")
        if resp.status_code >= 400:
            self._check(resp)
        return resp.text

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _keyed(affinity: str | None) -> dict[str, Any]:
    return {"headers": {AFFINITY_HEADER: affinity}} if affinity else {}
