"""The algorithm contract, as it was imported before it moved to :mod:`fedco.algorithms.core`.

Every public name this module held is re-exported here, so ``fedco.algorithms.base.X``
keeps working; each now lives in the module of its concern:
``core.types`` (``Algorithm``, ``CommPlan``, ``make_plan``, ``ScalarOrSchedule``,
``Optimizer``, ``PyTree``), ``core.registry`` (``factory``, ``register``, ``REGISTRY``,
``UnknownAlgorithmError``), ``core.trackers`` (``Pending``, ``pending_or``,
``fill_pending``, ``has_pending``, ``init_trackers``), ``core.fields`` (``get_field``,
``set_fields``), ``core.composition`` (``chain``, ``named_chain``, ``inject_hyperparams``,
``InjectedServerState``), ``core.servers`` (``RoundInfo``, ``ServerAggregator``,
``averaging_server``, ``optax_aggregator``, ``as_aggregator``, ``weighted_client_mean``,
``project_simplex``) and ``core.steps`` (``param_optimizer``, ``require``, ``oracles``,
``add_grads``, ``at_round_start``, ``at_round_end``, ``select``, ``strong``). Write new code
against :mod:`fedco.extend` (an algorithm of your own) or :mod:`fedco.algorithms`.
"""

from fedco.algorithms.core.composition import (
  InjectedServerState,
  chain,
  inject_hyperparams,
  named_chain,
)
from fedco.algorithms.core.fields import get_field, set_fields
from fedco.algorithms.core.registry import REGISTRY, UnknownAlgorithmError, factory, register
from fedco.algorithms.core.servers import (
  RoundInfo,
  ServerAggregator,
  as_aggregator,
  averaging_server,
  optax_aggregator,
  project_simplex,
  weighted_client_mean,
)
from fedco.algorithms.core.steps import (
  add_grads,
  at_round_end,
  at_round_start,
  oracles,
  param_optimizer,
  require,
  select,
  strong,
)
from fedco.algorithms.core.trackers import (
  Pending,
  fill_pending,
  has_pending,
  init_trackers,
  pending_or,
)
from fedco.algorithms.core.types import (
  Algorithm,
  CommPlan,
  Optimizer,
  PyTree,
  ScalarOrSchedule,
  make_plan,
)

__all__ = [
  "PyTree",
  "CommPlan",
  "Algorithm",
  "ScalarOrSchedule",
  "Optimizer",
  "make_plan",
  "factory",
  "UnknownAlgorithmError",
  "REGISTRY",
  "register",
  "Pending",
  "has_pending",
  "init_trackers",
  "fill_pending",
  "pending_or",
  "get_field",
  "set_fields",
  "chain",
  "named_chain",
  "InjectedServerState",
  "inject_hyperparams",
  "RoundInfo",
  "ServerAggregator",
  "weighted_client_mean",
  "optax_aggregator",
  "as_aggregator",
  "project_simplex",
  "averaging_server",
  "param_optimizer",
  "require",
  "oracles",
  "add_grads",
  "select",
  "at_round_start",
  "at_round_end",
  "strong",
]
