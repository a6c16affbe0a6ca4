"""Every public name meets the docstring standard (optax's): summary, Args, Returns, Examples.

A public name is one in the ``__all__`` of a public module below. The examples themselves run
as doctests (``conftest.py`` collects ``fedco/`` for pytest), and the API reference in
``docs/api`` is generated from the same docstrings, so a name added without them fails here.
"""

import importlib
import inspect

import pytest

from fedco import _api

PUBLIC_MODULES = _api.PUBLIC_MODULES
# Functions and classes, each once, under the module that first lists it (where the API
# reference documents it). Type aliases are typing's objects: their modules' docstrings
# describe them.
PUBLIC = [
  (e.home, e.obj)
  for e in _api.entries()
  if e.kind in ("class", "function") and e.home == f"{e.module}.{e.name}"
]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_public_module_declares_all_and_every_listed_name_exists(name):
  module = importlib.import_module(name)
  assert inspect.getdoc(module), f"{name} has no module docstring"
  assert hasattr(module, "__all__"), f"{name} has no __all__"
  missing = [attr for attr in module.__all__ if not hasattr(module, attr)]
  assert not missing, f"{name}.__all__ lists names it does not define: {missing}"


def test_fedcos_public_functions_and_classes_are_all_in_all():
  import fedco

  defined = {
    n
    for n, obj in vars(fedco).items()
    if not n.startswith("_")
    and (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismodule(obj))
    and (getattr(obj, "__module__", None) or obj.__name__).startswith("fedco")
  }
  assert defined <= set(fedco.__all__), sorted(defined - set(fedco.__all__))


def _parameters(obj):
  target = obj.__init__ if inspect.isclass(obj) else obj
  try:
    params = inspect.signature(target).parameters
  except (TypeError, ValueError):
    return []
  return [p for p in params.values() if p.name not in ("self", "cls")]


def _problems(obj) -> list:
  doc = inspect.getdoc(obj) or ""
  if not doc.strip():
    return ["no docstring"]
  found = []
  summary = doc.strip().splitlines()[0]
  if not summary.rstrip().endswith("."):
    found.append("the summary line does not end with a full stop")
  if inspect.isclass(obj) and issubclass(obj, BaseException):
    return found  # an error: its summary says when it is raised
  if inspect.isclass(obj):
    own_init = (
      "__init__" in vars(obj) or hasattr(obj, "_fields") or hasattr(obj, "__dataclass_fields__")
    )
    if own_init and _parameters(obj) and "Args:" not in doc and "Attributes:" not in doc:
      found.append("no Args: or Attributes: section")
  else:
    if _parameters(obj) and "Args:" not in doc:
      found.append("no Args: section")
    annotation = inspect.signature(obj).return_annotation
    if annotation not in (None, "None") and "Returns:" not in doc and "Yields:" not in doc:
      found.append("no Returns: section")
  if "Examples:" not in doc or ">>>" not in doc:
    found.append("no Examples: section with a >>> example")
  return found


@pytest.mark.parametrize("name,obj", PUBLIC, ids=[n for n, _ in PUBLIC])
def test_public_name_has_summary_args_returns_and_a_running_example(name, obj):
  problems = _problems(obj)
  assert not problems, f"{name}: " + "; ".join(problems)
