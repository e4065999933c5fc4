"""What one runtime process serves and its bounds: the single declaration of every knob (the CLI derives from it)."""

from __future__ import annotations

import ipaddress
import os

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract.runtime_http import SECRET_ENV


def is_loopback_literal(host: str) -> bool:
    """Whether `host` is `localhost` or a loopback IP literal. No name resolution: this decides what a server may
    bind, and a bind address that resolves elsewhere later must not pass."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RuntimeSettings(BaseModel):
    """Validated once, at the edge."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    handler: str = Field(description="package.module:function")
    host: str = Field(default="127.0.0.1", description="bind address; loopback unless --allow-remote")
    port: int = Field(default=0, ge=0, le=65535, description="0 binds a free port (see the READY line)")
    concurrency: int = Field(default=1, gt=0, description="handler calls at once (docs/gateway.md: 1 per instance)")
    queue_max: int = Field(default=16, ge=0, description="calls waiting for a slot; beyond that 429")
    timeout_s: float = Field(default=60.0, gt=0, description="bound on one call (then 504 and recycle) and its wait")
    drain_timeout_s: float | None = Field(default=None, gt=0, description="SIGTERM grace; None: timeout_s")
    allow_remote: bool = Field(default=False, description="allow a non-loopback host (containers bind 0.0.0.0)")

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> RuntimeSettings:
        if not self.allow_remote and not is_loopback_literal(self.host):
            raise ValueError(f"host {self.host!r} is not loopback; pass --allow-remote to serve on it")
        return self


def runtime_secret() -> str | None:
    """The secret every request must carry (SECRET_HEADER), from SECRET_ENV; None when unset or empty. Read from
    the environment, never a flag: a command line is visible to every user of the machine."""
    return os.environ.get(SECRET_ENV) or None
