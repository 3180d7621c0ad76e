"""FastAPI dependencies every service's api.py uses: the runtime, its clock, the admin token, whole state.

    from whaleflux.shared.deps import AdminDep, NowDep, runtime_of

    @router.post("/v1/silences", dependencies=[AdminDep])
    async def create(body: SilenceIn, now: NowDep, store: StoreDep) -> Silence: ...

`AdminDep` goes in `dependencies=[...]`; as a parameter, use `_: Admin`.
A service defines its own typed dependencies for what it put in `ServiceParts.state`:
`def _store(request: Request) -> AlertStore: return request.app.state.store`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request

from .runtime import Runtime
from .runtime_http import require_admin

__all__ = ["Admin", "AdminDep", "NowDep", "RuntimeDep", "StateDep", "WholeState", "now", "require_admin",
           "require_state", "runtime_of"]


def runtime_of(request: Request) -> Runtime:
    """The runtime of the app serving this request (`app.state.runtime`)."""
    runtime = getattr(request.app.state, "runtime", None)
    if not isinstance(runtime, Runtime):
        raise RuntimeError("this app was not built by Runtime.app: no app.state.runtime")
    return runtime


def now(request: Request) -> datetime:
    """The time by the runtime's injected clock."""
    return runtime_of(request).clock()


def require_state(request: Request) -> None:
    """503 (StateUnavailable) unless the service's state store is reachable and whole."""
    runtime_of(request).require_state()


AdminDep = Depends(require_admin)
Admin = Annotated[None, AdminDep]
NowDep = Annotated[datetime, Depends(now)]
RuntimeDep = Annotated[Runtime, Depends(runtime_of)]
StateDep = Depends(require_state)
WholeState = Annotated[None, StateDep]
