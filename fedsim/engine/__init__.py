from fedsim.engine.aggregate import weighted_average
from fedsim.engine.simulation import RunResult, run

__all__ = ["RunResult", "run", "weighted_average"]
