"""fedco algorithms: optax-style client transforms with a communication plan and a server.

Each algorithm is built by a factory of its hyperparameters (``fedco.feddro(learning_rate,
local_steps, beta=...)``) and is an :class:`Algorithm`: an optax
``GradientTransformationExtraArgs`` whose ``update`` takes the oracles of the compositional
problem (``inner_fn(x) = g(x; zeta)``, ``outer_fn(y) = f(y; xi)``, ...) as keyword
arguments, plus a :class:`CommPlan` (which state fields the runtime averages, and when), a
server (an optax transform on pseudo-gradients, or a :class:`ServerAggregator`) and the
problem class it solves (``"local"``, ``"global"`` or ``"plain"``). The contract is in
``fedco.algorithms.base``; :func:`chain`, :func:`named_chain` and :func:`inject_hyperparams`
compose algorithms with optax and keep them runnable in :func:`fedco.simulate`.

Every module of this package but ``base`` defines algorithms and registers them
(:func:`fedco.extend.register`); importing the package imports them all, so
:data:`ALGORITHMS` (name -> factory), this package's names and ``fedco``'s follow from the
modules alone: a new built-in algorithm is one module (and its tests). To write your own,
see :mod:`fedco.extend`.

Examples:
  >>> import fedco
  >>> opt = fedco.algorithms.ALGORITHMS["feddro"](0.05, local_steps=4)
  >>> opt.problem_kind, opt.plan.local_steps, opt.plan.every_step
  ('global', 4, ('y',))
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
