"""Ray engine. ``run`` is imported on first use so that ``fedsim.engine.server`` (whose actor process only
routes and aggregates) can be imported without torch."""
from fedsim.engine.aggregate import weighted_average

__all__ = ["RunResult", "run", "weighted_average"]


def __getattr__(name: str):
    if name in ("RunResult", "run"):
        from fedsim.engine import simulation

        return getattr(simulation, name)
    raise AttributeError(f"module 'fedsim.engine' has no attribute {name!r}")
