"""The platform a job runs on: the given Redis and gateway, or an embedded Redis and a local gateway process."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from types import TracebackType

from cache import Cache, CacheSettings
from cache.lifetime import die_with_parent, stop_process
from gateway.client import GatewayClient


class PlatformError(RuntimeError):
    pass


class Platform:
    """Context manager: `cache` and `gateway` (a client) are ready inside; everything started is stopped on exit,
    Ctrl-C included (the gateway drains its instances; the embedded redis-server goes last)."""

    def __init__(self, *, redis_url: str | None, gateway_url: str | None, gateway_token: str | None) -> None:
        self.redis_url = redis_url
        self.gateway_url = gateway_url
        self.gateway_token = gateway_token
        self.gateway_proc: subprocess.Popen[str] | None = None
        self.cache: Cache | None = None
        self.gateway: GatewayClient | None = None

    def __enter__(self) -> Platform:
        try:
            self.cache = Cache(CacheSettings(url=self.redis_url or os.environ.get("REDIS_URL") or None))
            if self.gateway_url is None:
                self._start_gateway()
            assert self.gateway_url is not None
            self.gateway = GatewayClient(self.gateway_url, token=self.gateway_token, timeout_s=3600)
        except BaseException:
            self.close()
            raise
        return self

    def _start_gateway(self) -> None:
        assert self.cache is not None
        self.gateway_token = secrets.token_hex(16)
        env = {
            **os.environ,
            "REDIS_URL": self.cache.url,
            "STELLARIS_GATEWAY_PORT": "0",
            "STELLARIS_GATEWAY_TOKEN": self.gateway_token,
            "STELLARIS_GATEWAY_NAMESPACE": f"local-{secrets.token_hex(4)}",
            "STELLARIS_LOG_LEVEL": os.environ.get("STELLARIS_LOG_LEVEL", "WARNING"),
        }
        self.gateway_proc = subprocess.Popen(
            [sys.executable, "-m", "gateway"], env=env, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent
        )
        assert self.gateway_proc.stdout is not None
        line = self.gateway_proc.stdout.readline()
        if not line.startswith("READY "):
            raise PlatformError(f"the local gateway did not start (exit code {self.gateway_proc.wait()})")
        self.gateway_url = f"http://127.0.0.1:{int(line.split()[1])}"

    def close(self) -> None:
        if self.gateway is not None:
            self.gateway.close()
        if self.gateway_proc is not None:
            stop_process(self.gateway_proc, 60)
        if self.cache is not None:
            self.cache.close()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
