"""How a run that broke says why: one line, without the traceback Ray wraps around a remote error."""
from __future__ import annotations

from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError


def describe_failure(err: BaseException) -> str:
    """One line for what broke."""
    if isinstance(err, RayTaskError) and isinstance(err.cause, RayActorError):  # raised in the server
        lines = [ln for ln in str(err.cause).splitlines() if ln.strip()]
        return f"a worker failed to start or died ({lines[-1].strip()[:200] if lines else 'no message'})"
    if isinstance(err, RayTaskError) and isinstance(err.cause, GetTimeoutError):  # the server's, naming a worker
        return str(err.cause).splitlines()[0]
    if isinstance(err, RayTaskError) and err.cause is not None and err.cause is not err:
        return describe_failure(err.cause)
    if isinstance(err, RayActorError):
        return "the server actor died (its process was killed or ran out of memory)"
    if isinstance(err, GetTimeoutError):
        return "no answer within engine.round_timeout_s"
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}{f' ({err.filename})' if err.filename else ''}"
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else 'no message'}"
