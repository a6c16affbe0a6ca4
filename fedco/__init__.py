"""fedco: federated compositional optimization in JAX.

Algorithms are optax-style transformations with a communication plan and a server
transform; the runtime simulates many clients in one jitted program.
"""

# First, before JAX loads: under `python -m fedco.<module>`, a Ctrl-C while it starts is one
# line and exit status 130 (decision 98); a library import is left alone.
from fedco import _startup  # noqa: F401  # isort: skip
from fedco import (
  algorithms,
  byzantine,
  compression,
  data,
  estimators,
  extend,
  io,
  metrics,
  models,
  privacy,
  problems,
  runtime,
)
from fedco.algorithms import (
  ALGORITHMS,
  Algorithm,
  CommPlan,
  chain,
  init_trackers,
  inject_hyperparams,
  named_chain,
)
from fedco.data import FederatedData
from fedco.problems import Problem, global_inner, local_inner, plain
from fedco.runtime import SimulationResult, Simulator, SweepResult, oracle_args, simulate, sweep

__version__ = "0.2.0"

globals().update(ALGORITHMS)  # fedco.feddro, fedco.scaffold, ...: every built-in algorithm

# They build on everything above: the contract kit and the experiment skeleton.
from fedco import experiment, testing  # noqa: E402


def __getattr__(name):
  """``fedco.checkpoint`` loads (with orbax, about half a second) when first used."""
  if name == "checkpoint":
    import importlib  # pylint: disable=g-import-not-at-top

    return importlib.import_module("fedco.checkpoint")
  raise AttributeError(f"module 'fedco' has no attribute {name!r}")


__all__ = [
  "algorithms",
  "checkpoint",
  "io",
  "testing",
  "experiment",
  "byzantine",
  "compression",
  "privacy",
  "data",
  "estimators",
  "extend",
  "metrics",
  "models",
  "problems",
  "runtime",
  "Algorithm",
  "CommPlan",
  "FederatedData",
  "Problem",
  "global_inner",
  "local_inner",
  "plain",
  "Simulator",
  "SimulationResult",
  "oracle_args",
  "simulate",
  "ALGORITHMS",
  "chain",
  "named_chain",
  "inject_hyperparams",
  "init_trackers",
  "sweep",
  "SweepResult",
  *ALGORITHMS,
]
