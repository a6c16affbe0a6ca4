"""The methods an experiment compares: :class:`Method` (one ``config.methods`` entry, checked
against its factory), :func:`methods`, :func:`method_entries`, the ablations and
:func:`same_iterations`."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Dict, List, Mapping, Optional, Sequence

import ml_collections
import numpy as np
from ml_collections import config_dict

import fedco
from fedco import extend
from fedco.experiment import outputs
from fedco.runtime.config import SAMPLINGS

METHOD_KEYS = ("algorithm", "learning_rate", "local_steps")


# What a method's clients send, how (fedco.privacy, fedco.compression), the trade-off
# curve a private or compressed method belongs to (figures group by it), how the server
# combines the uploads and which clients are Byzantine (fedco.byzantine).
UPLINK_KEYS = (
  "privacy",
  "compression",
  "curve",
  "aggregation",
  "byzantine",
  "participation",
  "asynchronous",
)
# byzantine.kind of clients that train honestly on flipped labels (a data transform,
# fedco.byzantine.flip_labels), beside the upload attacks of fedco.byzantine.ATTACKS, and
# the settings it takes
LABEL_FLIP = "label_flip"
LABEL_FLIP_SETTINGS = ("fraction", "seed", "num_classes", "label_key")
# a method's participation settings: the fedco.simulate arguments it sets over the experiment's
PARTICIPATION = ("clients_per_round", "sampling")


# config codec name -> fedco.compression factory
CODECS = {
  "quantize": "stochastic_quantization",
  "top_k": "top_k",
  "adaptive": "adaptive_quantization",
}

# config privacy mechanism name -> fedco.privacy factory ("gaussian" when unnamed)
MECHANISMS = {"gaussian": "gaussian", "dp_ftrl": "dp_ftrl"}


@dataclasses.dataclass(frozen=True)
class Method:
  """One compared run of an experiment.

  Attributes:
    label: its key in ``config.methods`` (or a variant's): the name in every output.
    algorithm: the ``fedco.ALGORITHMS`` name.
    kwargs: the factory's other arguments from the config.
    learning_rate, local_steps: the shared values or the method's own.
    source: the ``config.methods`` label it comes from when it is a variant (an ablation's
      ``comfedl_gamma=2`` of ``comfedl``): the entry a divergence note names.
    uplink: the method's ``privacy`` (``{epsilon | noise_multiplier, delta, clip}``),
      ``compression`` (``{field: {codec, ...}}``), ``curve``, ``aggregation`` (``{rule,
      ...}``: a :mod:`fedco.byzantine` rule and its settings), ``byzantine``
      (:func:`fedco.byzantine.attack`'s settings; ``kind: "label_flip"`` for clients
      that train on flipped labels, :meth:`training_data`) and ``participation``
      (``{clients_per_round, sampling}``: the method's own cohort and schedule, over the
      experiment's) settings; empty without.
    problem: the experiment's own settings of this run (a KL temperature, a problem form).

  Examples:
    >>> from fedco import experiment
    >>> method = experiment.Method("fedprox", "fedprox", {"mu": 0.1}, 0.05, 5)
    >>> method.build().plan.local_steps  # fedco.fedprox(0.05, 5, mu=0.1)
    5
    >>> method.settings()
    {'algorithm': 'fedprox', 'learning_rate': 0.05, 'local_steps': 5, 'mu': 0.1}
    >>> variant = method.variant("fedprox_mu=1", kwargs={"mu": 1.0})  # an ablation's run
    >>> variant.label, variant.entry
    ('fedprox_mu=1', 'fedprox')
  """

  label: str
  algorithm: str
  kwargs: Dict[str, Any]
  learning_rate: float
  local_steps: int
  source: str = ""
  uplink: Dict[str, Any] = dataclasses.field(default_factory=dict)
  problem: Dict[str, Any] = dataclasses.field(default_factory=dict)

  def variant(self, label: str, **changes) -> "Method":
    """This method with other settings under another label (an ablation's run)."""
    return dataclasses.replace(self, label=label, source=self.source or self.label, **changes)

  @property
  def takes_local_steps(self) -> bool:
    """Whether the algorithm's factory takes ``local_steps`` (else one step a round)."""
    return "local_steps" in inspect.signature(fedco.ALGORITHMS[self.algorithm]).parameters

  @property
  def entry(self) -> str:
    """The ``config.methods`` label this run comes from."""
    return self.source or self.label

  def build(self, *, config_field: Optional[str] = None, **changes):
    """The algorithm, with ``changes`` (``learning_rate=``, factory arguments) applied.

    The factory's ``ValueError`` names ``config_field`` (default: the method's entry,
    ``--config.methods.<label>``, and the argument when the config gave it)."""
    factory = fedco.ALGORITHMS[self.algorithm]
    kwargs = {**self.kwargs, **changes}
    learning_rate = kwargs.pop("learning_rate", self.learning_rate)
    if self.takes_local_steps:
      kwargs.setdefault("local_steps", self.local_steps)
    else:
      kwargs.pop("local_steps", None)
    try:
      return factory(learning_rate, **kwargs)
    except ValueError as err:
      arg = (str(err).split() or [""])[0]
      given = (*self.kwargs, "learning_rate", "local_steps")  # by the config, not the module
      field = arg if arg in given and arg not in changes else ""
      where = config_field or f"--config.methods.{self.entry}{'.' + field if field else ''}"
      raise ValueError(f"{where} is invalid for fedco.{self.algorithm}: {err}") from None

  def settings(self) -> Dict[str, Any]:
    """Everything that defines the method's runs (for identities and summaries)."""
    return {
      "algorithm": self.algorithm,
      "learning_rate": self.learning_rate,
      "local_steps": self.local_steps,
      **self.kwargs,
      **self.uplink,
      **self.problem,
    }

  @property
  def curve(self) -> str:
    """The trade-off curve the method is a point of (its label without one)."""
    return self.uplink.get("curve", self.label)

  def simulator_kwargs(self) -> Dict[str, Any]:
    """``privacy=``, ``compression=``, ``aggregation=`` and ``byzantine=`` for
    ``fedco.simulate`` from :attr:`uplink` (and ``sampling="epochs"`` under DP-FTRL)."""
    out: Dict[str, Any] = {}
    if self.uplink.get("privacy"):
      out["privacy"] = _privacy(self.uplink["privacy"])
      if isinstance(out["privacy"], fedco.privacy.TreeDP):
        out["sampling"] = "epochs"  # each client at most once a tree
    if self.uplink.get("compression"):
      out["compression"] = {
        field: getattr(fedco.compression, CODECS[spec["codec"]])(
          **{k: v for k, v in spec.items() if k != "codec"}
        )
        for field, spec in self.uplink["compression"].items()
      }
    if self.uplink.get("aggregation"):
      spec = dict(self.uplink["aggregation"])
      out["aggregation"] = getattr(fedco.byzantine, spec.pop("rule"))(**spec)
    if self.uplink.get("byzantine") and not self.flips_labels:
      out["byzantine"] = fedco.byzantine.attack(**self.uplink["byzantine"])
    out.update(self.uplink.get("participation", {}))
    if self.uplink.get("asynchronous"):
      out["asynchronous"] = fedco.runtime.Buffered(**self.uplink["asynchronous"])
    return out

  @property
  def flips_labels(self) -> bool:
    """Whether this method's Byzantine clients train on flipped labels (``byzantine.kind:
    "label_flip"``: :meth:`training_data` differs from the experiment's data)."""
    return (self.uplink.get("byzantine") or {}).get("kind") == LABEL_FLIP

  def training_data(self, data):
    """``data`` as this method's clients train on it: under ``byzantine.kind:
    "label_flip"``, the attack's clients hold labels ``C - 1 - y``
    (:func:`fedco.byzantine.flip_labels`; ``C`` the largest label plus one, or the
    attack's ``num_classes``); else ``data`` itself."""
    if not self.flips_labels:
      return data
    spec = {k: v for k, v in self.uplink["byzantine"].items() if k != "kind"}
    label_key = spec.pop("label_key", "y")
    num_classes = spec.pop("num_classes", None)
    if num_classes is None:
      num_classes = int(np.max(np.asarray(data.examples[label_key]))) + 1
    attack = fedco.byzantine.attack(**spec)
    return fedco.byzantine.flip_labels(data, attack, num_classes, label_key)


# ---- the config ----------------------------------------------------------------------------


def method_entries(entries) -> ml_collections.ConfigDict:
  """``config.methods`` from ``{label: {"algorithm": name, argument: value, ...}}``.

  Every entry gets ``learning_rate`` and ``local_steps`` as typed placeholders where it does
  not set them (the shared ``config.learning_rate`` / ``config.local_steps`` then apply), so
  ``--config.methods.<label>.learning_rate=0.05`` overrides any method from the command
  line.

  Args:
    entries: ``{label: {"algorithm": a fedco.ALGORITHMS name, factory argument: value}}``;
      an entry may set its own ``learning_rate`` / ``local_steps``, and the experiment's own
      fields (``problem``) or ``privacy`` / ``compression`` settings.

  Returns:
    The ``ConfigDict`` for ``config.methods``.

  Examples:
    >>> from fedco import experiment
    >>> methods = experiment.method_entries({
    ...     "fedavg": {"algorithm": "fedavg"},
    ...     "fedprox": {"algorithm": "fedprox", "mu": 0.1, "local_steps": 10}})
    >>> methods.fedavg.learning_rate is None  # a placeholder: config.learning_rate applies
    True
    >>> methods.fedprox.local_steps
    10
  """
  out = {}
  for label, entry in dict(entries).items():
    entry = dict(entry)
    for key, kind in (("learning_rate", float), ("local_steps", int)):
      if entry.get(key) is None:  # unset (or an unset placeholder's to_dict())
        entry[key] = config_dict.placeholder(kind)
    out[label] = entry
  return ml_collections.ConfigDict(out)


def methods(config, *, extra_keys: Sequence[str] = ("problem",)) -> List[Method]:
  """The config's methods, each checked against its factory's signature.

  Args:
    config: the experiment config.
    extra_keys: method fields the experiment reads itself (``problem``: a problem form or
      settings), kept in :attr:`Method.problem`, not passed to the factory.

  Returns:
    One :class:`Method` per entry of ``config.methods``, in the order of their labels; an
    unknown algorithm or argument is a ``ValueError`` naming the field and what is allowed.

  Examples:
    >>> import ml_collections
    >>> from fedco import experiment
    >>> config = ml_collections.ConfigDict({
    ...     "learning_rate": 0.1, "local_steps": 5,
    ...     "methods": experiment.method_entries(
    ...         {"fedprox": {"algorithm": "fedprox", "mu": 0.1, "learning_rate": 0.05}})})
    >>> [(m.label, m.learning_rate, m.local_steps, m.kwargs) for m in experiment.methods(config)]
    [('fedprox', 0.05, 5, {'mu': 0.1})]
  """
  if not config.methods:
    raise ValueError("--config.methods must name at least one method")
  out = []
  for label, entry in config.methods.items():
    where = f"--config.methods.{label}"
    if not hasattr(entry, "items") or "algorithm" not in entry:
      raise ValueError(
        f"{where} must hold an 'algorithm' (one of "
        f"{sorted(fedco.ALGORITHMS)}) and its arguments, got {entry!r}"
      )
    name = entry["algorithm"]
    if name not in fedco.ALGORITHMS:
      raise ValueError(f"{where}.algorithm must be one of {sorted(fedco.ALGORITHMS)}, got {name!r}")
    allowed = [
      p
      for p in inspect.signature(fedco.ALGORITHMS[name]).parameters
      if p not in ("learning_rate", "optimizer")
    ]
    kwargs, problem = {}, {}
    for key, value in entry.items():
      if key in METHOD_KEYS or key in UPLINK_KEYS:
        continue
      if key in extra_keys:
        problem[key] = _plain(value)
      elif key not in allowed:
        raise ValueError(
          f"{where}.{key} is not an argument of fedco.{name}; allowed: "
          f"{sorted(set(allowed) | {'learning_rate'})}"
        )
      else:
        kwargs[key] = tuple(value) if isinstance(value, list) else value
    lr = _own(entry, "learning_rate", config.learning_rate)
    extend.positive(f"--config.methods.{label}.learning_rate", lr)
    steps = _own(entry, "local_steps", config.local_steps)
    extend.positive_int(f"--config.methods.{label}.local_steps", steps)
    out.append(
      Method(
        label,
        name,
        kwargs,
        float(lr),
        int(steps),
        uplink=uplink_settings(where, entry),
        problem=problem,
      )
    )
  return out


def _own(entry, key, shared):
  """A method's own ``key`` (``None``: an unset placeholder) or the shared value."""
  value = entry.get(key)
  return shared if value is None else value


def _plain(value):
  """A config value as plain Python (ConfigDicts to dicts, lists to tuples)."""
  if hasattr(value, "items"):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return tuple(_plain(v) for v in value)
  return value


def uplink_settings(where: str, entry) -> Dict[str, Any]:
  """A method's ``privacy``, ``compression`` and ``curve``, checked by building them (a
  one-line ``ValueError`` naming the field under ``where``, e.g. ``--config.methods.m``).

  Examples:
    >>> import ml_collections
    >>> from fedco.experiment import config_methods
    >>> entry = ml_collections.ConfigDict({"compression": {"y": {"codec": "top_k", "fraction": 0.1}}})
    >>> config_methods.uplink_settings("--config.methods.m", entry)
    {'compression': {'y': {'codec': 'top_k', 'fraction': 0.1}}}
  """
  out = {}
  for name, shape in (
    ("privacy", "{mechanism, epsilon or noise_multiplier, delta, clip}"),
    ("compression", "{field: {codec: ..., ...}}"),
    ("aggregation", "{rule: ..., ...}"),
    ("byzantine", "{fraction, kind, scale, fields, seed}"),
    ("participation", "{clients_per_round, sampling}"),
    ("asynchronous", "{concurrency, max_staleness, staleness_exponent}"),
  ):
    if entry.get(name) and not hasattr(entry[name], "items"):
      raise ValueError(f"{where}.{name} must be {shape}, got {entry[name]!r}")
    if entry.get(name):
      out[name] = _plain(entry[name])
  for name, check in (
    ("privacy", _check_privacy),
    ("compression", _check_compression),
    ("aggregation", _check_aggregation),
    ("byzantine", _check_byzantine),
    ("participation", _check_participation),
    ("asynchronous", _check_asynchronous),
  ):
    if name in out:
      check(f"{where}.{name}", out[name])
  if entry.get("curve"):
    out["curve"] = str(entry["curve"])
  return out


def _check_privacy(where: str, settings) -> None:
  """``privacy``'s mechanism built from its settings (``adaptive`` a dict)."""
  settings = dict(settings)
  adaptive = settings.get("adaptive")
  if adaptive is not None and not isinstance(adaptive, dict):
    raise ValueError(
      f"{where}.adaptive must be {{target_quantile, learning_rate, count_noise}}, got {adaptive!r}"
    )
  if adaptive is not None:
    settings["adaptive"] = _built(
      f"{where}.adaptive", "adaptive clipping", fedco.privacy.adaptive_clipping, adaptive
    )
  mechanism = settings.pop("mechanism", "gaussian")
  extend.one_of(f"{where}.mechanism", mechanism, list(MECHANISMS))
  factory = getattr(fedco.privacy, MECHANISMS[mechanism])
  _built(where, "privacy", factory, settings, ("rounds",))


def _check_compression(where: str, fields) -> None:
  """Each field's codec built from its settings."""
  for field, spec in fields.items():
    codec = spec.get("codec") if isinstance(spec, dict) else None
    extend.one_of(f"{where}.{field}.codec", codec, list(CODECS))
    assert isinstance(codec, str)  # one_of refused anything else
    factory = getattr(fedco.compression, CODECS[codec])
    _built(f"{where}.{field}", codec, factory, {k: v for k, v in spec.items() if k != "codec"})


def _check_aggregation(where: str, spec) -> None:
  """The rule built from its settings."""
  extend.one_of(f"{where}.rule", spec.get("rule"), list(fedco.byzantine.RULES))
  rule = getattr(fedco.byzantine, spec["rule"])
  _built(where, spec["rule"], rule, {k: v for k, v in spec.items() if k != "rule"})


def _check_byzantine(where: str, spec) -> None:
  """The attack built from its settings; ``kind: "label_flip"`` takes ``fraction``,
  ``seed``, ``num_classes`` and ``label_key``."""
  if spec.get("kind") != LABEL_FLIP:
    _built(where, "byzantine", fedco.byzantine.attack, spec)
    return
  unknown = sorted(set(spec) - {"kind", *LABEL_FLIP_SETTINGS})
  if unknown:
    raise ValueError(
      f"{where}.{unknown[0]} is not a label_flip setting; allowed: {list(LABEL_FLIP_SETTINGS)}"
    )
  attack = {k: spec[k] for k in ("fraction", "seed") if k in spec}  # the attack's own
  _built(where, "byzantine", fedco.byzantine.attack, attack)
  if "num_classes" in spec:
    extend.positive_int(f"{where}.num_classes", spec["num_classes"], minimum=2)


def _check_participation(where: str, spec) -> None:
  """``clients_per_round`` a positive int, ``sampling`` one of the schedules."""
  unknown = sorted(set(spec) - set(PARTICIPATION))
  if unknown:
    raise ValueError(
      f"{where}.{unknown[0]} is not a participation setting; allowed: {list(PARTICIPATION)}"
    )
  if "clients_per_round" in spec:
    extend.positive_int(f"{where}.clients_per_round", spec["clients_per_round"])
  if "sampling" in spec:
    extend.one_of(f"{where}.sampling", spec["sampling"], list(SAMPLINGS))


def _check_asynchronous(where: str, spec) -> None:
  """FedBuff's settings (:class:`fedco.runtime.Buffered`); the run checks them against its
  clients."""
  _built(where, "asynchronous", fedco.runtime.Buffered, spec)


def _privacy(settings):
  """The mechanism of a method's ``privacy`` settings: ``fedco.privacy.gaussian`` (``adaptive``
  a dict of :func:`fedco.privacy.adaptive_clipping`'s) or, under ``mechanism: "dp_ftrl"``,
  ``fedco.privacy.dp_ftrl``."""
  settings = dict(settings)
  factory = getattr(fedco.privacy, MECHANISMS[settings.pop("mechanism", "gaussian")])
  if settings.get("adaptive") is not None:
    settings["adaptive"] = fedco.privacy.adaptive_clipping(**settings["adaptive"])
  return factory(**settings)


def _built(where: str, what: str, factory, kwargs, hidden=()):
  """``factory(**kwargs)``, an unknown key or a bad value a ``ValueError`` naming ``where``."""
  allowed = [p for p in inspect.signature(factory).parameters if p not in hidden]
  unknown = sorted(set(kwargs) - set(allowed))
  if unknown:
    raise ValueError(f"{where}.{unknown[0]} is not a {what} setting; allowed: {allowed}")
  try:
    return factory(**kwargs)
  except (TypeError, ValueError) as err:  # TypeError: a required setting missing
    raise ValueError(f"{where}: {err}") from None


def ablation(config, defaults: Mapping[str, Sequence[float]]) -> tuple:
  """The values of ``config.ablation``, checked.

  ``config.ablation_values``, or the paper's ``defaults[config.ablation]``: distinct integers
  ``>= 1`` for ``local_steps``, distinct positive numbers otherwise; none for ``"none"``.

  Args:
    config: the experiment config (``ablation``, ``ablation_values``).
    defaults: ``{ablated setting: the paper's values}``; its keys are the allowed
      ``config.ablation`` values besides ``"none"``.

  Returns:
    The values, a tuple (empty without an ablation).

  Examples:
    >>> import ml_collections
    >>> from fedco import experiment
    >>> config = ml_collections.ConfigDict({"ablation": "gamma", "ablation_values": ()})
    >>> experiment.ablation(config, {"gamma": (0.1, 1.0), "local_steps": (1, 5)})
    (0.1, 1.0)
  """
  allowed = ("none",) + tuple(defaults)
  extend.one_of("--config.ablation", config.ablation, allowed)
  if config.ablation == "none":
    if config.ablation_values:
      raise ValueError(f"--config.ablation_values needs --config.ablation (one of {allowed[1:]})")
    return ()
  given = config.ablation_values or defaults[config.ablation]
  try:
    values = tuple(float(v) for v in given)
  except (TypeError, ValueError):
    raise ValueError(f"--config.ablation_values must be numbers, got {given!r}") from None
  if config.ablation == "local_steps":
    if not all(v.is_integer() for v in values):
      raise ValueError(
        f"--config.ablation_values must be integers >= 1 for local_steps, got {given!r}"
      )
    return outputs.check_int_list(
      "--config.ablation_values", [int(v) for v in values], 1, distinct=True
    )
  for v in values:
    extend.positive("--config.ablation_values", v)
  if len(set(values)) != len(values):
    raise ValueError(f"--config.ablation_values lists a value twice: {values}")
  return values


def ablated(
  config, base: Method, values: Sequence[float], problem_keys: Sequence[str] = ()
) -> List[Method]:
  """``base`` once per value of ``config.ablation``'s setting.

  The setting is its ``local_steps``, a factory argument, or (named in ``problem_keys``) one
  of the run's :attr:`Method.problem` settings.

  Args:
    config: the experiment config (``ablation`` names the setting).
    base: the ablated method.
    values: the ablation's values (:func:`ablation`).
    problem_keys: settings that belong to the problem, not to the factory.

  Returns:
    The variants, labelled ``<base label>_<setting>=<value>``.

  Examples:
    >>> import ml_collections
    >>> from fedco import experiment
    >>> base = experiment.Method("comfedl", "comfedl", {}, 0.01, 5)
    >>> config = ml_collections.ConfigDict({"ablation": "local_steps"})
    >>> [m.label for m in experiment.ablated(config, base, (1, 10))]
    ['comfedl_local_steps=1', 'comfedl_local_steps=10']
  """
  out = []
  for v in values:
    key = config.ablation
    if key == "local_steps":
      out.append(base.variant(f"{base.label}_local_steps={int(v)}", local_steps=int(v)))
    elif key in problem_keys:
      out.append(base.variant(f"{base.label}_{key}={v:g}", problem={**base.problem, key: v}))
    else:
      out.append(base.variant(f"{base.label}_{key}={v:g}", kwargs={**base.kwargs, key: v}))
  return out


def local_steps_ablation(
  config, compared: Sequence[Method], algorithms: Sequence[str], default: Sequence[int]
) -> List[Method]:
  """The methods a local-steps ablation runs, or ``compared`` without one.

  Under ``config.ablation = "local_steps"`` (values: ``default`` unless
  ``config.ablation_values``), each method of ``compared`` running one of ``algorithms``
  once per value; ``ValueError`` when there is none.

  Args:
    config: the experiment config.
    compared: the config's methods (:func:`methods`).
    algorithms: the algorithms whose methods the ablation varies.
    default: the paper's values.

  Returns:
    The methods to run.

  Examples:
    >>> import ml_collections
    >>> from fedco import experiment
    >>> config = ml_collections.ConfigDict({"ablation": "local_steps", "ablation_values": (2, 4)})
    >>> compared = [experiment.Method(a, a, {}, 0.1, 8) for a in ("feddro", "fedavg")]
    >>> [m.label for m in experiment.local_steps_ablation(config, compared, ("feddro",), (1, 8))]
    ['feddro_local_steps=2', 'feddro_local_steps=4']
  """
  values = ablation(config, {"local_steps": default})
  found = [m for m in compared if m.algorithm in algorithms]
  if values and not found:
    raise ValueError(
      f"--config.ablation=local_steps needs a {' or '.join(algorithms)} method in --config.methods"
    )
  return [v for m in found for v in ablated(config, m, values)] if values else list(compared)


def same_iterations(config, method: Method) -> Dict[str, int]:
  """The ``rounds`` and ``eval_every`` that give ``method`` the shared schedule's iterations.

  That is the config's ``rounds * local_steps`` local iterations, evaluated at the same
  iterations as the shared schedule.

  Args:
    config: the experiment config (``rounds``, ``local_steps``, ``eval_every``).
    method: a method with its own ``local_steps``, which must divide the iterations.

  Returns:
    ``{"rounds": ..., "eval_every": ...}`` for :class:`Run`.

  Examples:
    >>> import ml_collections
    >>> from fedco import experiment
    >>> config = ml_collections.ConfigDict({"rounds": 100, "local_steps": 5, "eval_every": 10})
    >>> experiment.same_iterations(config, experiment.Method("m", "local_scgdm", {}, 1.0, 1))
    {'rounds': 500, 'eval_every': 50}
  """
  iterations = config.rounds * config.local_steps
  if iterations % method.local_steps:
    raise ValueError(
      f"--config.methods.{method.entry}.local_steps must divide the "
      f"{iterations} iterations (config.rounds * config.local_steps), got "
      f"{method.local_steps}"
    )
  rounds = iterations // method.local_steps
  every = config.eval_every * config.local_steps // method.local_steps
  return {"rounds": rounds, "eval_every": max(1, min(every, rounds))}


def check_batch_size(size: Optional[int], data, flag: str = "--config.batch_size") -> None:
  """``ValueError`` naming ``flag`` when the batch size ``size`` (``0`` or ``None``: each
  client's whole data) exceeds the largest client of ``data`` (a ``FederatedData`` or a
  ``ClientStore``) and the default 32: ``fedco.simulate``'s rule
  (``fedco.runtime.config.refuse_oversized_batch``), named as a config field (decision 98)."""
  counts = getattr(data, "counts", None)
  if counts is not None:
    fedco.runtime.config.refuse_oversized_batch(flag, size, np.asarray(counts), whole="0")
