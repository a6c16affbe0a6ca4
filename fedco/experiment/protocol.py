"""The experiment protocol: every hook an experiment may define, with its default.

An experiment is a module (``experiments/<name>.py``, or your own) or an instance of a
subclass of :class:`Experiment`; :func:`of` turns either into an :class:`Experiment` whose
every hook exists (the module's where it defines one, the default elsewhere), and refuses,
in one line naming the hooks, what would otherwise be skipped without a word: a misspelled
hook (``summarise``, ``TABLE_KEY``), a hook of the wrong kind (a ``plot`` that is not a
function, a ``TRADEOFF`` that is not a dict) or with parameters that cannot take the
runner's arguments, and a missing ``build``, ``TABLE_KEYS`` or ``PROGRESS``.

Examples:
  >>> import types
  >>> from fedco.experiment import protocol
  >>> module = types.ModuleType("mine")
  >>> module.TABLE_KEYS, module.PROGRESS = ("objective",), "objective"
  >>> module.build = lambda config, method, seed, prepared: None
  >>> experiment = protocol.of(module)
  >>> experiment.name, experiment.setup(config=None), experiment.report({})
  ('mine', None, ())
  >>> module.summarise = lambda config, outcome: {}  # British spelling: never called
  >>> protocol.of(module)  # doctest: +ELLIPSIS
  Traceback (most recent call last):
  ...
  ValueError: experiment mine defines summarise, which is no experiment hook (did you mean summarize?); the hooks are ...
"""

from __future__ import annotations

import difflib
import inspect
import types
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

# Every hook: its parameters (a function) or None (a constant). Required: build,
# TABLE_KEYS and PROGRESS.
HOOKS: Dict[str, Optional[Tuple[str, ...]]] = {
  "TABLE_KEYS": None,
  "PROGRESS": None,
  "TRADEOFF": None,
  "SEEDS_IN_ONE_PROGRAM": None,
  "check": ("config",),
  "setup": ("config",),
  "methods": ("config", "setup"),
  "prepare": ("config", "seed", "setup"),
  "build": ("config", "method", "seed", "prepared"),
  "finish": ("config", "method", "seed", "result", "final"),
  "summarize": ("config", "outcome"),
  "plot": ("wd", "config", "outcome"),
  "report": ("summary",),
}
REQUIRED = ("build", "TABLE_KEYS", "PROGRESS")


class Experiment:
  """An experiment's hooks with their defaults: subclass it, or write a module with them.

  :func:`fedco.experiment.train_and_evaluate` takes either as ``module=`` (a module is
  read through :func:`of`).

  Attributes:
    TABLE_KEYS: the final values its table shows (mean +- std over the seeds). Required.
    PROGRESS: the metric the progress bar shows. Required.
    TRADEOFF: ``{"epsilon" | "bytes_up": panels}``, each panel ``(metric, axis label[,
      "log"])``: the privacy and compression trade-off figures. Default: none.
    SEEDS_IN_ONE_PROGRAM: whether a method's seeds may run as one vmapped program (their
      runs differ only in ``data``, ``params`` and ``metrics_data``). Default ``False``.
    name: the experiment's name (its module's, or its class's).
    source: the object whose source file names its code in run identities (the module, or
      the class).

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> from fedco import experiment
    >>> class LeastSquares(experiment.Experiment):
    ...   TABLE_KEYS, PROGRESS = ("objective",), "objective"
    ...   def build(self, config, method, seed, prepared):
    ...     x = np.random.default_rng(seed).normal(size=(2, 10, 3)).astype(np.float32)
    ...     data = fedco.FederatedData.from_clients([{"x": c, "y": c.sum(1)} for c in x])
    ...     loss = lambda w, e: 0.5 * (e["x"] @ w - e["y"]) ** 2
    ...     return experiment.Run(fedco.plain(loss), method.build(), data, jnp.zeros(3))
    >>> mine = experiment.protocol.of(LeastSquares())
    >>> mine.name, mine.SEEDS_IN_ONE_PROGRAM, mine.report({})
    ('LeastSquares', False, ())
  """

  TABLE_KEYS: Sequence[str] = ()
  PROGRESS: str = ""
  TRADEOFF: Mapping[str, Any] = types.MappingProxyType({})
  SEEDS_IN_ONE_PROGRAM: bool = False

  @property
  def name(self) -> str:
    return type(self).__name__

  @property
  def source(self) -> Any:
    return type(self)

  def check(self, config) -> None:
    """Its own config fields, checked (``ValueError`` naming ``--config.<field>``)."""

  def setup(self, config) -> Any:
    """What every run shares (data loaded once), passed to :meth:`prepare`: an object of
    yours (this repository's experiments return a dataclass, ``Shared``, read by attribute;
    a name close to a hook's, such as ``Setup``, is refused as a misspelled hook)."""
    return None

  def methods(self, config, setup) -> Optional[Sequence[Any]]:
    """The runs (an ablation's variants: override); ``None``, the default, is the config's
    methods (:func:`fedco.experiment.methods`)."""
    return None

  def prepare(self, config, seed, setup) -> Any:
    """What the runs of one seed share (data, initial model): ``setup`` by default (this
    repository's experiments return a dataclass, ``PerSeed``)."""
    return setup

  def build(self, config, method, seed, prepared) -> Any:
    """One run's :class:`fedco.experiment.Run`. Required."""
    raise NotImplementedError(f"experiment {self.name} defines no build")

  def finish(self, config, method, seed, result, final) -> None:
    """Adds values to a finished run's ``final`` dict."""

  def summarize(self, config, outcome) -> Dict[str, Any]:
    """The summary's own entries."""
    return {}

  def plot(self, wd, config, outcome) -> None:
    """Its figures, into ``wd``."""

  def report(self, summary) -> Sequence[str]:
    """Lines printed after the table."""
    return ()


class _FromModule(Experiment):
  """A module's hooks, the defaults where it defines none."""

  def __init__(self, module):
    self._module = module
    for hook in HOOKS:
      if hasattr(module, hook):
        setattr(self, hook, getattr(module, hook))

  @property
  def name(self) -> str:
    return self._module.__name__

  @property
  def source(self) -> Any:
    return self._module


def of(experiment) -> Experiment:
  """``experiment`` (a module, or an :class:`Experiment`) as an :class:`Experiment`, checked.

  Raises:
    ValueError: a required hook missing, a public name of the module close to a hook name
      but not one (a misspelling), a hook of the wrong kind, or a hook function whose
      parameters cannot take the runner's arguments; one line naming the hooks.
  """
  out = experiment if isinstance(experiment, Experiment) else _FromModule(experiment)
  where = f"experiment {out.name}"
  listed = f"; the hooks are {', '.join(HOOKS)} (fedco.experiment.protocol)"
  if not isinstance(experiment, Experiment):
    for name in _own_names(experiment):
      close = difflib.get_close_matches(name, HOOKS, n=1, cutoff=0.8) or [
        hook for hook in HOOKS if hook.lower() == name.lower()
      ]
      if close and name not in HOOKS:
        raise ValueError(
          f"{where} defines {name}, which is no experiment hook (did you mean {close[0]}?){listed}"
        )
  for hook in REQUIRED:
    if not _defines(experiment, hook):
      raise ValueError(f"{where} defines no {hook}{listed}")
  for hook, params in HOOKS.items():
    _check_hook(where, hook, params, getattr(out, hook), listed)
  return out


def _defines(experiment, hook) -> bool:
  if isinstance(experiment, Experiment):
    return getattr(type(experiment), hook) is not getattr(Experiment, hook)
  return hasattr(experiment, hook)


def _own_names(module):
  """The public names of ``module`` that are not modules (``np``, ``fedco`` are left out)."""
  for name, value in vars(module).items():
    if not name.startswith("_") and not isinstance(value, types.ModuleType):
      yield name


def _check_hook(where, hook, params, value, listed) -> None:
  if params is None:
    kinds: Dict[str, Any] = {
      "TABLE_KEYS": (list, tuple),
      "PROGRESS": str,
      "TRADEOFF": Mapping,
      "SEEDS_IN_ONE_PROGRAM": bool,
    }
    if not isinstance(value, kinds[hook]):
      raise ValueError(f"{where}: {hook} must be a {_kind(kinds[hook])}, got {value!r}{listed}")
    return
  if not callable(value):
    raise ValueError(f"{where}: {hook} must be a function {hook}({', '.join(params)}){listed}")
  try:
    inspect.signature(value).bind(*params)
  except TypeError:
    raise ValueError(
      f"{where}: {hook}{inspect.signature(value)} cannot take the runner's arguments "
      f"{hook}({', '.join(params)}){listed}"
    ) from None
  except ValueError:  # no signature to read (a builtin): taken as it is
    return


def _kind(kinds) -> str:
  kinds = kinds if isinstance(kinds, tuple) else (kinds,)
  return " or ".join(k.__name__ for k in kinds)


__all__ = ["HOOKS", "REQUIRED", "Experiment", "of"]
