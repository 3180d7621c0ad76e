"""FastAPI dependencies every service's api.py uses: the runtime, its clock, the roles, whole state.

    from whaleflux.shared.deps import OperatorDep, NowDep, ViewerDep, runtime_of

    alerts = APIRouter(tags=["alerts"], dependencies=[ViewerDep])   # reads: a viewer (in production)

    @alerts.post("/v1/silences", dependencies=[OperatorDep])
    async def create(body: SilenceIn, now: NowDep, store: StoreDep) -> Silence: ...

The `*Dep` go in `dependencies=[...]`; as a parameter, `caller: Submitter` is the principal (None only for
`Viewer` in development). Which role each route needs is in docs/security.md (a test keeps the two equal).
A service defines its own typed dependencies for what it put in `ServiceParts.state`:
`def _store(request: Request) -> AlertStore: return request.app.state.store`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request

from .access import Principal
from .access_http import require_role, require_team
from .runtime import Runtime
from .runtime_http import require_admin

__all__ = ["Admin", "AdminDep", "NowDep", "Operator", "OperatorDep", "RuntimeDep", "StateDep", "Submitter",
           "SubmitterDep", "Viewer", "ViewerDep", "WholeState", "now", "require_admin", "require_state",
           "require_team", "runtime_of"]


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


ViewerDep = Depends(require_role("viewer"))
SubmitterDep = Depends(require_role("submitter"))
OperatorDep = Depends(require_role("operator"))
AdminDep = Depends(require_admin)
Viewer = Annotated[Principal | None, ViewerDep]
Submitter = Annotated[Principal, SubmitterDep]
Operator = Annotated[Principal, OperatorDep]
Admin = Annotated[Principal, AdminDep]
NowDep = Annotated[datetime, Depends(now)]
RuntimeDep = Annotated[Runtime, Depends(runtime_of)]
StateDep = Depends(require_state)
WholeState = Annotated[None, StateDep]
