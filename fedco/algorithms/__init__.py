"""fedco algorithms: optax-style client transforms with a communication plan and a server.

Every module of this package but ``base`` defines algorithms and registers them
(:func:`fedco.extend.register`); importing the package imports them all, so
:data:`ALGORITHMS` (name -> factory), this package's names and ``fedco``'s follow from the
modules alone: a new built-in algorithm is one module (and its tests).
"""

import importlib as _importlib
import pkgutil as _pkgutil

from fedco.algorithms import base
from fedco.algorithms.base import (
  Algorithm,
  CommPlan,
  InjectedServerState,
  Pending,
  RoundInfo,
  ServerAggregator,
  averaging_server,
  chain,
  get_field,
  init_trackers,
  inject_hyperparams,
  make_plan,
  named_chain,
  project_simplex,
  set_fields,
)

for _module in sorted(m.name for m in _pkgutil.iter_modules(__path__)):
  if _module != "base" and not _module.startswith("_"):
    _importlib.import_module(f"{__name__}.{_module}")

#: Every registered algorithm factory by name (built-in, and any a user registered).
ALGORITHMS = base.REGISTRY
globals().update(ALGORITHMS)  # fedco.algorithms.<name>, also where a module has that name

__all__ = [
  "ALGORITHMS",
  "Algorithm",
  "CommPlan",
  "RoundInfo",
  "ServerAggregator",
  "averaging_server",
  "make_plan",
  "project_simplex",
  "chain",
  "named_chain",
  "inject_hyperparams",
  "init_trackers",
  "get_field",
  "set_fields",
  "Pending",
  "InjectedServerState",
  *ALGORITHMS,
]
