"""Algorithm factories and the registry: :func:`factory`, :func:`register`, ``REGISTRY``.

:func:`factory` marks a factory's structural arguments (those
:func:`fedco.inject_hyperparams` keeps static) and records what built each algorithm;
:func:`register` adds a factory to ``REGISTRY`` (``fedco.ALGORITHMS``), whose failed
lookups raise :class:`UnknownAlgorithmError` naming the close matches.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from typing import Optional, Tuple

from fedco.algorithms.core.types import Algorithm

# Annotations of arguments that inject_hyperparams would mistake for hyperparameters: an int
# becomes a traced number, an optimizer factory (a callable) a schedule. (Strings and bools
# stay static by their value.)
_STRUCTURAL = {"int", "Optimizer"}


def _structural(annotation) -> bool:
  """Whether an annotation (a string under ``from __future__ import annotations``, or an
  ``int`` object) is an int or an optimizer, alone or with ``None`` (``Optional[...]``, ``X |
  None``), however the module was imported (``base.``, ``extend.``, ``fedco.``)."""
  # (Optimizer is Optional[Any] once evaluated: only its written name tells it apart.)
  if annotation is int or annotation == Optional[int]:
    return True
  text = annotation if isinstance(annotation, str) else repr(annotation)
  for prefix in ("typing.", "fedco.algorithms.base.", "fedco.extend.", "fedco.", "extend."):
    text = text.replace(prefix, "")
  text = text.replace("base.", "").replace("Optional[", "").replace("Union[", "")
  names = {n.strip() for n in text.replace("]", "").replace("|", ",").split(",")} - {"None"}
  return bool(names) and names <= _STRUCTURAL


def factory(*, static: Tuple[str, ...] = ()):
  """Marks an algorithm factory's structural arguments (``static_args``).

  :func:`inject_hyperparams` keeps these static (a compiled program depends on them:
  ``local_steps``, counts, the ``optimizer``); every other numeric argument becomes state.
  Checked when the factory is decorated: ``static`` must name arguments of the factory, and
  every argument annotated ``int`` (or ``Optional[int]``) or ``Optimizer``, or unannotated
  with an ``int`` default, must be in it: under ``inject_hyperparams`` an int would
  silently become a traced number and an optimizer factory a schedule. (``str`` and
  ``bool`` arguments stay static by value.)
  Every :class:`Algorithm` the decorated factory builds records what built it in its
  ``arguments`` attribute (``{"factory": name, argument: value, ...}``, defaults included),
  which run fingerprints read.

  Args:
    static: the names of the factory's structural arguments (a tuple, or one name as a
      string); default: none.

  Returns:
    a decorator; it returns the factory wrapped (same signature and docstring), with
    ``static_args``, the tuple of ``static``.

  Raises:
    ValueError: ``static`` names an unknown argument, or leaves out a structural one.

  Examples:
    >>> import optax
    >>> from fedco import extend
    >>> @extend.factory(static=("local_steps",))
    ... def local_sgd(learning_rate: float = 0.1, local_steps: int = 2):
    ...   tx = optax.with_extra_args_support(optax.sgd(learning_rate))
    ...   plan = extend.make_plan(local_steps)
    ...   return extend.Algorithm(tx.init, tx.update, plan, extend.averaging_server(),
    ...                           "local_sgd", "plain")
    >>> local_sgd.static_args
    ('local_steps',)
    >>> local_sgd(0.5).arguments
    {'factory': 'local_sgd', 'learning_rate': 0.5, 'local_steps': 2}
    >>> @extend.factory()  # an int argument left out of static
    ... def bad(local_steps: int = 2):
    ...   pass
    Traceback (most recent call last):
      ...
    ValueError: @factory(static=...) of bad leaves out ['local_steps']: ...
  """
  static = (static,) if isinstance(static, str) else tuple(static)

  def mark(fn):
    signature = inspect.signature(fn)
    name = getattr(fn, "__name__", repr(fn))
    unknown = [a for a in static if a not in signature.parameters]
    if unknown:
      raise ValueError(
        f"@factory(static=...) of {name} names {unknown}, which are not its "
        f"arguments; allowed: {list(signature.parameters)}"
      )
    missing = [
      p.name
      for p in signature.parameters.values()
      if p.name not in static
      and (
        _structural(p.annotation)
        if p.annotation is not inspect.Parameter.empty
        else type(p.default) is int  # unannotated with an int default: an int
      )
    ]
    if missing:
      raise ValueError(
        f"@factory(static=...) of {name} leaves out {missing}: arguments "
        f"annotated int or Optimizer (or unannotated with an int default) shape the "
        f"compiled program and must be static (add them to static=, or annotate a "
        f"number float and give it a float default)"
      )

    @functools.wraps(fn)
    def build(*args, **kwargs):
      algorithm = fn(*args, **kwargs)
      if isinstance(algorithm, Algorithm):  # what built it, for run fingerprints
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        algorithm.__dict__["arguments"] = {"factory": fn.__name__, **bound.arguments}
      return algorithm

    build.static_args = tuple(static)
    return build

  return mark


class UnknownAlgorithmError(KeyError):
  """A name ``fedco.ALGORITHMS`` does not hold; the message names the close matches.

  A ``KeyError``, so ``except KeyError`` still catches it; its message prints as written
  (a bare ``KeyError`` quotes its argument).
  """

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else ""


class _Registry(dict):
  """``fedco.ALGORITHMS``: a dict whose failed lookups name the close matches."""

  def __missing__(self, name):
    names = sorted(self)
    close = difflib.get_close_matches(str(name).lower(), names, n=3, cutoff=0.6)
    quoted = [repr(c) for c in close]
    hint = f" (did you mean {' or '.join(quoted)}?)" if close else ""
    raise UnknownAlgorithmError(
      f"fedco.ALGORITHMS has no algorithm {name!r}{hint}; its {len(names)} names are "
      "sorted(fedco.ALGORITHMS), each described in docs/algorithms.md"
    )


# name -> factory of every registered algorithm: fedco.ALGORITHMS.
REGISTRY: dict = _Registry()


def register(*, settings: dict):
  """Adds a :func:`factory` to ``fedco.ALGORITHMS`` under its function name.

  Built-in algorithms are registered in their own module, so adding one is that module and
  its tests; ``fedco.ALGORITHMS``, ``fedco.<name>``, the test suite's coverage and the mesh
  and multi-process checks follow. A user's algorithm needs no registration to run
  anywhere (``simulate``, ``sweep``, :func:`fedco.testing.check_algorithm`); registering it
  makes it a name the experiment configs accept (``methods.<label>.algorithm``). Put
  ``@register`` above ``@factory``. Registering the same function again is allowed.

  Args:
    settings: ``{label: keyword arguments}``: small configurations that converge on the
      test problem (``fedco.testing``'s portfolio), run by the contract tests; more than one
      label tests several configurations (``fedavg_co``'s cases).

  Returns:
    a decorator that registers the factory and returns it unchanged but for its
    ``settings`` attribute (a copy of ``settings``).

  Raises:
    ValueError: the name is taken, the function is not a :func:`factory`, or ``settings``
      is empty or names arguments the factory does not take.

  Examples:
    >>> import optax
    >>> import fedco
    >>> from fedco import extend
    >>> @extend.register(settings={"my_sgd": dict(learning_rate=0.1)})
    ... @extend.factory(static=("local_steps",))
    ... def my_sgd(learning_rate: float = 0.1, local_steps: int = 2):
    ...   tx = optax.with_extra_args_support(optax.sgd(learning_rate))
    ...   plan = extend.make_plan(local_steps)
    ...   return extend.Algorithm(tx.init, tx.update, plan, extend.averaging_server(),
    ...                           "my_sgd", "plain")
    >>> fedco.ALGORITHMS["my_sgd"] is my_sgd, my_sgd.settings
    (True, {'my_sgd': {'learning_rate': 0.1}})
    >>> del fedco.ALGORITHMS["my_sgd"]  # leave the registry as it was
  """
  if not isinstance(settings, dict) or not settings:
    raise ValueError(
      f"register(settings=...) needs a non-empty dict {{label: kwargs}}, got {settings!r}"
    )

  def add(fn):
    name = getattr(fn, "__name__", None)
    if not hasattr(fn, "static_args"):
      raise ValueError(
        f"register: decorate {name} with @factory(static=...) first (under @register)"
      )
    if name in REGISTRY and REGISTRY[name] is not fn:
      raise ValueError(f"register: an algorithm named {name!r} is registered already")
    parameters = inspect.signature(fn).parameters
    for label, kwargs in settings.items():
      unknown = set(kwargs) - set(parameters)
      if unknown:
        raise ValueError(
          f"register: settings[{label!r}] of {name} names {sorted(unknown)}, "
          "which are not its arguments"
        )
    fn.settings = {label: dict(kwargs) for label, kwargs in settings.items()}
    REGISTRY[name] = fn
    return fn

  return add
