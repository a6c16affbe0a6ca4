"""fedco algorithms: optax-style client transforms with a communication plan and a server.

Each algorithm is built by a factory of its hyperparameters (``fedco.feddro(learning_rate,
local_steps, beta=...)``) and is an :class:`Algorithm`: an optax
``GradientTransformationExtraArgs`` whose ``update`` takes the oracles of the compositional
problem (``inner_fn(x) = g(x; zeta)``, ``outer_fn(y) = f(y; xi)``, ...) as keyword
arguments, plus a :class:`CommPlan` (which state fields the runtime averages, and when), a
server (an optax transform on pseudo-gradients, or a :class:`ServerAggregator`) and the
problem class it solves (``"local"``, ``"global"`` or ``"plain"``). The contract is in
the subpackage ``fedco.algorithms.core``, one concern a module (``fedco.algorithms.base``
re-exports it as it was); :func:`chain`, :func:`named_chain` and :func:`inject_hyperparams`
compose algorithms with optax and keep them runnable in :func:`fedco.simulate`.

Every module of this package but ``base`` (and the ``core`` subpackage) defines algorithms
and registers them (:func:`fedco.extend.register`); importing the package imports them all,
so :data:`ALGORITHMS` (name -> factory), ``fedco.<name>`` and this package's names follow
from the modules alone: a new built-in algorithm is one module (and its tests). Each module
stays importable as ``fedco.algorithms.<module>`` (``fedco.algorithms.scaffold`` is the
module; its factory is ``fedco.scaffold``); a factory is also ``fedco.algorithms.<name>``
where no module has its name. To write your own, see :mod:`fedco.extend`.

Examples:
  >>> import fedco
  >>> opt = fedco.algorithms.ALGORITHMS["feddro"](0.05, local_steps=4)
  >>> opt.problem_kind, opt.plan.local_steps, opt.plan.every_step
  ('global', 4, ('y',))
"""

import importlib as _importlib
import pkgutil as _pkgutil

from fedco.algorithms import base  # noqa: F401  (the contract's old home)
from fedco.algorithms.core.composition import (
  InjectedServerState,
  chain,
  inject_hyperparams,
  named_chain,
)
from fedco.algorithms.core.fields import get_field, set_fields
from fedco.algorithms.core.registry import REGISTRY
from fedco.algorithms.core.servers import (
  RoundInfo,
  ServerAggregator,
  averaging_server,
  project_simplex,
)
from fedco.algorithms.core.trackers import Pending, init_trackers
from fedco.algorithms.core.types import Algorithm, CommPlan, make_plan

_MODULES = sorted(
  m.name for m in _pkgutil.iter_modules(__path__) if not m.ispkg and m.name != "base"
)
for _module in _MODULES:
  if not _module.startswith("_"):
    _importlib.import_module(f"{__name__}.{_module}")

#: Every registered algorithm factory by name (built-in, and any a user registered).
ALGORITHMS = REGISTRY
# fedco.algorithms.<name> for every factory but those whose name is a module's
# (fedco.algorithms.scaffold stays the module; fedco.scaffold is its factory).
_FACTORIES = {name: fn for name, fn in ALGORITHMS.items() if name not in _MODULES}
globals().update(_FACTORIES)
# A personalised method's client model (FedPer, FedRep, APFL, Ditto; decision 110).
from fedco.algorithms.personal import personal_model  # noqa: E402

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
  "personal_model",
  *_FACTORIES,
]
