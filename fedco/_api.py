"""The public API: its modules and what each lists, as the docs and the docstring tests see it.

``docs/conf.py`` generates the API reference from :func:`entries` and
``tests/test_docstrings.py`` holds every function and class in it to the docstring
standard, so the two agree on what is public and where each name is documented.
"""

import importlib
import inspect
import typing
from typing import Any, Dict, List, NamedTuple

#: The public modules, in the order the API reference lists them.
PUBLIC_MODULES = (
  "fedco",
  "fedco.algorithms",
  "fedco.problems",
  "fedco.runtime",
  "fedco.data",
  "fedco.privacy",
  "fedco.compression",
  "fedco.byzantine",
  "fedco.models",
  "fedco.extend",
  "fedco.testing",
  "fedco.experiment",
  "fedco.estimators",
  "fedco.metrics",
  "fedco.checkpoint",
  "fedco.io",
)


class Entry(NamedTuple):
  """One name in a public module's ``__all__`` (submodules left out).

  Attributes:
    module: the module whose ``__all__`` lists it.
    name: the name there.
    obj: the object.
    kind: ``"class"``, ``"function"``, ``"alias"`` (a ``typing`` alias such as
      ``extend.Optimizer``) or ``"data"`` (a constant: a dict, a tuple, a string).
    home: ``module.name`` of the first listing in :data:`PUBLIC_MODULES` order, where the
      object is documented; equal to this entry's own qualified name there.
  """

  module: str
  name: str
  obj: Any
  kind: str
  home: str


def _kind(obj) -> str:
  if inspect.isclass(obj):
    return "class"
  if typing.get_origin(obj) is not None:
    return "alias"
  return "function" if callable(obj) else "data"


def entries() -> List[Entry]:
  """Every public module's listed names, in order; an object listed twice keeps one home.

  Classes and functions are the same object wherever they are re-exported; aliases and
  constants are told apart by where they are listed.

  Returns:
    The entries of every module of :data:`PUBLIC_MODULES`, in ``__all__`` order.

  Examples:
    >>> from fedco import _api
    >>> scgdm = [e for e in _api.entries() if e.name == "local_scgdm"]
    >>> [(e.module, e.kind, e.home) for e in scgdm]  # re-exported: documented at the top
    [('fedco', 'function', 'fedco.local_scgdm'), ('fedco.algorithms', 'function', 'fedco.local_scgdm')]
  """
  homes: Dict[Any, str] = {}
  found: List[Entry] = []
  for module_name in PUBLIC_MODULES:
    module = importlib.import_module(module_name)
    for name in module.__all__:
      obj = getattr(module, name)
      if inspect.ismodule(obj):
        continue
      kind = _kind(obj)
      key = id(obj) if kind in ("class", "function") else (module_name, name)
      home = homes.setdefault(key, f"{module_name}.{name}")
      found.append(Entry(module_name, name, obj, kind, home))
  return found
