"""A run's plan: everything derivable from its config, data and partition, built once on the driver
(:func:`fedsim.plan.build.build_plan`). ``RunPlan`` and the workers' ``WorkerPlan`` are in ``run``; who takes part
(``Population``, the samplers, the evaluation cohort) in ``population``; which worker trains which client in
``assignment``; the round-0 model in ``model``; the virtual clock in ``system`` and ``async_clock``; privacy's
accounting in ``privacy``. This package re-exports what its users import."""
from fedsim.plan.assignment import balanced_owners, steps_per_epoch, worker_count
from fedsim.plan.model import ModelPlan
from fedsim.plan.population import (Population, cohort_size, evaluation_cohort, held_out_clients, poisson_clients,
                                    sample_clients)
from fedsim.plan.run import RunPlan, WorkerPlan

__all__ = ["ModelPlan", "Population", "RunPlan", "WorkerPlan", "balanced_owners", "cohort_size", "evaluation_cohort",
           "held_out_clients", "poisson_clients", "sample_clients", "steps_per_epoch", "worker_count"]
