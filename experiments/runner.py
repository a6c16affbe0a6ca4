"""What every config experiment shares: the vocabulary, the methods, the run loop, grids.

**Vocabulary.** Every ``experiments/configs/<name>.py`` names the same things the same way:
``experiment`` (the module run), ``seeds``, ``rounds``, ``local_steps``, ``learning_rate``,
``batch_size`` (``0``: each client's whole data), ``eval_every``, and ``methods``: one entry
per compared method, keyed by the label every output uses (progress bar, ``metrics.jsonl``,
``summary.json``, tables and legends), each holding ``algorithm`` (a ``fedco.ALGORITHMS``
name) and that factory's own arguments (``q``, ``weights_lr``, ``beta``, ...);
``learning_rate`` or ``local_steps`` inside a method override the shared ones. The paper
grids live in ``grid``: ``grid.learning_rate`` for every method, ``grid.<algorithm>.<arg>``
per algorithm (and experiment-specific problem axes such as ``grid.gamma``).

**Options that do not change results** (``--progress``, ``--resume``,
``--checkpoint_every``) are the driver's flags, not config fields, so ``--help`` lists them
and a run's checkpoint hash is its config alone.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

import fedco
from experiments import common

# The fields every experiment config has (tests/test_configs.py checks each config).
SHARED = ("experiment", "seeds", "rounds", "local_steps", "learning_rate", "batch_size",
          "eval_every", "methods")
METHOD_KEYS = ("algorithm", "learning_rate", "local_steps")
# What a method's clients send, how (fedco.privacy, fedco.compression), and the trade-off
# curve a private or compressed method belongs to (figures group by it).
UPLINK_KEYS = ("privacy", "compression", "curve")
# config codec name -> (fedco.compression factory, its config fields)
CODECS = {"quantize": ("stochastic_quantization", ("bits", "scale")),
          "top_k": ("top_k", ("fraction", "error_feedback")),
          "adaptive": ("adaptive_quantization", ("bits", "initial_scale", "grow", "shrink"))}


@dataclasses.dataclass(frozen=True)
class Options:
  """The driver's flags: how to run, never what (they are left out of checkpoint hashes)."""
  progress: bool = True
  resume: bool = True
  checkpoint_every: int = 50


@dataclasses.dataclass(frozen=True)
class Method:
  """One compared method of a config.

  Attributes:
    label: its key in ``config.methods``: the name in every output.
    algorithm: the ``fedco.ALGORITHMS`` name.
    kwargs: the factory's other arguments from the config.
    learning_rate, local_steps: the shared values or the method's own.
    source: the ``config.methods`` label it comes from when it is a variant (an ablation's
      ``comfedl_gamma=2`` of ``comfedl``): the field a divergence note names.
    uplink: the method's ``privacy`` (``{epsilon | noise_multiplier, delta, clip}``),
      ``compression`` (``{field: {codec: quantize | top_k, bits, scale, fraction,
      error_feedback}}``) and ``curve`` settings, checked; empty when it has none.
  """
  label: str
  algorithm: str
  kwargs: Dict[str, Any]
  learning_rate: float
  local_steps: int
  source: str = ""
  uplink: Dict[str, Any] = dataclasses.field(default_factory=dict)

  def variant(self, label: str, **changes) -> "Method":
    """This method with other settings under another label (an ablation's run)."""
    return dataclasses.replace(self, label=label, source=self.source or self.label, **changes)

  @property
  def factory(self):
    return fedco.ALGORITHMS[self.algorithm]

  def build(self, **changes):
    """The algorithm, with ``changes`` (``learning_rate=``, factory arguments) applied."""
    kwargs = {**self.kwargs, **changes}
    learning_rate = kwargs.pop("learning_rate", self.learning_rate)
    if "local_steps" in inspect.signature(self.factory).parameters:
      kwargs.setdefault("local_steps", self.local_steps)
    else:
      kwargs.pop("local_steps", None)
    return self.factory(learning_rate, **kwargs)

  def settings(self) -> Dict[str, Any]:
    """Everything that defines the method's runs (for checkpoint hashes and summaries)."""
    return {"algorithm": self.algorithm, "learning_rate": self.learning_rate,
            "local_steps": self.local_steps, **self.kwargs, **self.uplink}

  @property
  def curve(self) -> str:
    """The trade-off curve the method is a point of (its label without one)."""
    return self.uplink.get("curve", self.label)

  def simulator_kwargs(self) -> Dict[str, Any]:
    """``privacy=`` and ``compression=`` for ``fedco.simulate`` from :attr:`uplink`."""
    out = {}
    private = self.uplink.get("privacy")
    if private:
      out["privacy"] = fedco.privacy.gaussian(**private)
    codecs = self.uplink.get("compression")
    if codecs:
      out["compression"] = {
          field: getattr(fedco.compression, CODECS[spec["codec"]][0])(
              **{k: v for k, v in spec.items() if k != "codec"})
          for field, spec in codecs.items()}
    return out


def seeds(config, field: str = "seeds") -> tuple:
  """``config.<field>`` as distinct integers (``ValueError`` naming the field)."""
  given = config[field]
  try:
    values = tuple(int(s) for s in (given if not isinstance(given, int) else (given,)))
  except (TypeError, ValueError):
    raise ValueError(f"--config.{field} must be integers, got {given!r}") from None
  if not values:
    raise ValueError(f"--config.{field} must name at least one seed")
  if len(set(values)) != len(values):
    raise ValueError(f"--config.{field} must be distinct, got {values}")
  return values


def check_shared(config) -> Dict[str, Any]:
  """The shared fields, checked (``ValueError`` naming ``--config.<field>``)."""
  for name in ("rounds", "local_steps", "eval_every"):
    common.check_int(f"config.{name}", config[name], 1)
  common.check_int("config.batch_size", config.batch_size, 0)
  common.check_positive("config.learning_rate", config.learning_rate)
  return {"seeds": seeds(config), "rounds": config.rounds, "local_steps": config.local_steps,
          "learning_rate": float(config.learning_rate), "batch_size": config.batch_size,
          "eval_every": config.eval_every}


def methods(config, *, extra_keys: Sequence[str] = ()) -> List[Method]:
  """The config's methods, each checked against its factory's signature.

  Args:
    config: the experiment config.
    extra_keys: method fields the experiment reads itself (``problem``, say), not passed to
      the factory.
  """
  if not config.methods:
    raise ValueError("--config.methods must name at least one method")
  out = []
  for label, entry in config.methods.items():
    where = f"--config.methods.{label}"
    if not hasattr(entry, "items") or "algorithm" not in entry:
      raise ValueError(f"{where} must hold an 'algorithm' (one of "
                       f"{sorted(fedco.ALGORITHMS)}) and its arguments, got {entry!r}")
    name = entry["algorithm"]
    if name not in fedco.ALGORITHMS:
      raise ValueError(f"{where}.algorithm must be one of {sorted(fedco.ALGORITHMS)}, got "
                       f"{name!r}")
    allowed = [p for p in inspect.signature(fedco.ALGORITHMS[name]).parameters
               if p not in ("learning_rate", "optimizer")]
    kwargs = {}
    for key, value in entry.items():
      if key in METHOD_KEYS or key in UPLINK_KEYS or key in extra_keys:
        continue
      if key not in allowed:
        raise ValueError(f"{where}.{key} is not an argument of fedco.{name}; allowed: "
                         f"{sorted(set(allowed) | {'learning_rate'})}")
      kwargs[key] = tuple(value) if isinstance(value, list) else value
    lr = entry.get("learning_rate", config.learning_rate)
    common.check_positive(f"config.methods.{label}.learning_rate", lr)
    steps = entry.get("local_steps", config.local_steps)
    common.check_int(f"config.methods.{label}.local_steps", steps, 1)
    out.append(Method(label, name, kwargs, float(lr), int(steps),
                      uplink=_uplink(where, entry)))
  return out


def _plain(value):
  """A config value as plain Python (ConfigDicts to dicts, lists to tuples)."""
  if hasattr(value, "items"):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return tuple(_plain(v) for v in value)
  return value


def _uplink(where: str, entry) -> Dict[str, Any]:
  """A method's ``privacy``, ``compression`` and ``curve``, checked by building them (a
  one-line ``ValueError`` naming the field)."""
  out = {}

  def mapping(name, shape):
    value = entry.get(name)
    if value and not hasattr(value, "items"):
      raise ValueError(f"{where}.{name} must be {shape}, got {value!r}")
    return _plain(value) if value else None

  private = mapping("privacy", "{epsilon or noise_multiplier, delta, clip}")
  if private:
    allowed = ("epsilon", "noise_multiplier", "delta", "clip")
    unknown = sorted(set(private) - set(allowed))
    if unknown:
      raise ValueError(f"{where}.privacy.{unknown[0]} is not a privacy setting; allowed: "
                       f"{list(allowed)}")
    try:
      fedco.privacy.gaussian(**private)
    except ValueError as err:
      raise ValueError(f"{where}.privacy: {err}") from None
    out["privacy"] = private
  codecs = mapping("compression", "{field: {codec: ..., ...}}")
  if codecs:
    for field, spec in codecs.items():
      name = spec.get("codec") if isinstance(spec, dict) else None
      if name not in CODECS:
        raise ValueError(f"{where}.compression.{field}.codec must be one of {list(CODECS)}, "
                         f"got {name!r}")
      unknown = sorted(set(spec) - {"codec", *CODECS[name][1]})
      if unknown:
        raise ValueError(f"{where}.compression.{field}.{unknown[0]} is not a {name} setting; "
                         f"allowed: {list(CODECS[name][1])}")
    out["compression"] = codecs
    try:
      Method("", "", {}, 1.0, 1, uplink=out).simulator_kwargs()
    except ValueError as err:
      raise ValueError(f"{where}.compression: {err}") from None
  if entry.get("curve"):
    out["curve"] = str(entry["curve"])
  return out


def ablation(config, defaults: Mapping[str, Sequence[float]]) -> tuple:
  """``config.ablation``'s values, checked: ``config.ablation_values`` or the paper's
  ``defaults[config.ablation]``; distinct integers ``>= 1`` for ``local_steps``, distinct
  positive numbers otherwise; none for ``"none"``."""
  allowed = ("none",) + tuple(defaults)
  if config.ablation not in allowed:
    raise ValueError(f"--config.ablation must be one of {allowed}, got {config.ablation!r}")
  if config.ablation == "none":
    if config.ablation_values:
      raise ValueError(f"--config.ablation_values needs --config.ablation (one of "
                       f"{allowed[1:]})")
    return ()
  given = config.ablation_values or defaults[config.ablation]
  try:
    values = tuple(float(v) for v in given)
  except (TypeError, ValueError):
    raise ValueError(f"--config.ablation_values must be numbers, got {given!r}") from None
  if config.ablation == "local_steps":
    if not all(v.is_integer() for v in values):
      raise ValueError(f"--config.ablation_values must be integers >= 1 for local_steps, got "
                       f"{given!r}")
    return common.check_int_list("config.ablation_values", values, 1, distinct=True)
  for v in values:
    common.check_positive("config.ablation_values", v)
  if len(set(values)) != len(values):
    raise ValueError(f"--config.ablation_values lists a value twice: {values}")
  return values


def diverged_note(label: str, err) -> Dict[str, Any]:
  """A diverged run's final entry: the round, the quantity and the field to change."""
  return {"diverged": f"diverged at round {err.round} ({err.quantity}); try a lower "
                      f"--config.methods.{label}.learning_rate",
          "diverged_round": err.round, "diverged_quantity": err.quantity}


class Writers:
  """The workdir's streamed metric files (``metrics.jsonl``, ``metrics.csv``), written by the
  runtime as each chunk of rounds finishes."""

  def __init__(self, wd: common.Workdir):
    self.writers = [fedco.runtime.JsonlWriter(wd.record(wd.file(common.METRICS))),
                    fedco.runtime.CsvWriter(wd.record(wd.file(common.METRICS_CSV)))]


def checkpoint_args(wd: common.Workdir, options: Options, label: str,
                    settings: Mapping[str, Any]) -> Dict[str, Any]:
  """``simulate``'s checkpoint arguments for one run: ``checkpoints/<label>-<hash>``."""
  directory = common.run_checkpoint_dir(wd.path, label, settings)
  wd.record(directory)
  return {"checkpoint_dir": directory, "checkpoint_every": options.checkpoint_every}


def simulate_method(method: Method, seed: int, *, problem, algorithm, data, params, wd,
                    options: Options, writers: Writers, settings: Mapping[str, Any],
                    finals: Dict[str, Dict[int, Any]], records: List[Dict[str, Any]],
                    progress_metric: str, record_keys: Optional[Sequence[str]] = None,
                    **simulate_kwargs):
  """One (method, seed) run through ``fedco.simulate``: streamed metrics, checkpoints
  (resumed on rerun), a divergence reported as such while the other runs go on.

  Fills ``finals[label][seed]`` (the metrics at the last evaluated round, or the divergence
  note) and appends the evaluated rounds (up to a divergence) to ``records``; returns the
  result or ``None``.
  """
  fields = lambda _: {"method": method.label, "seed": seed}
  simulate_kwargs = {**method.simulator_kwargs(), **simulate_kwargs}
  try:
    result = fedco.simulate(
        problem, algorithm, data, params, seed=seed, metric_writers=writers.writers,
        metric_labels={"method": method.label, "seed": seed}, progress=options.progress,
        progress_metric=progress_metric,
        **checkpoint_args(wd, options, f"{method.label}-seed{seed}",
                          {**settings, "method": method.settings(), "seed": seed}),
        **simulate_kwargs)
  except fedco.runtime.NonFiniteError as err:
    finals.setdefault(method.label, {})[seed] = diverged_note(method.source or method.label,
                                                              err)
    records.extend(common.evaluated_records(err.metrics, fields, keys=record_keys,
                                            finite_only=True))
    return None
  records.extend(common.evaluated_records(result.metrics, fields, keys=record_keys))
  final = common.final_metrics(result.metrics)
  final["seconds"] = result.seconds
  final["bytes_up"] = result.ledger["total_bytes_up"]
  if "epsilon" in result.metrics:
    final["epsilon"] = float(result.metrics["epsilon"][-1])
  finals.setdefault(method.label, {})[seed] = final
  return result


# ---- grid search -------------------------------------------------------------------------

def grid_axes(config, method: Method, problem_axes: Mapping[str, Sequence[float]] = ()
              ) -> Dict[str, tuple]:
  """The grid of one method: ``grid.learning_rate``, its algorithm's ``grid.<algorithm>``
  axes, then ``problem_axes`` (experiment-specific, e.g. the KL temperature)."""
  axes = {"learning_rate": tuple(float(v) for v in config.grid.learning_rate)}
  own = config.grid.get(method.algorithm)
  if own is not None:
    allowed = inspect.signature(method.factory).parameters
    for name, values in own.items():
      if name not in allowed:
        raise ValueError(f"--config.grid.{method.algorithm}.{name} is not an argument of "
                         f"fedco.{method.algorithm}")
      axes[name] = tuple(float(v) for v in values)
  axes.update({k: tuple(float(v) for v in vs) for k, vs in dict(problem_axes).items()})
  for name, values in axes.items():
    if not values:
      raise ValueError(f"--config.grid.{name} must hold at least one value")
  return axes


def search(method: Method, axes: Mapping[str, tuple], *, problem_axes: Sequence[str],
           make_problem: Callable[[Dict[str, float]], Any],
           algorithm_kwargs: Callable[[Dict[str, float]], Dict[str, Any]],
           score: Callable[[Dict[str, np.ndarray], int], Sequence[float]], data, params,
           seed: int,
           rounds: int, progress: bool = False, **simulator_kwargs) -> Dict[str, Any]:
  """Every point of a method's grid, as one ``fedco.sweep`` program per problem point.

  The algorithm axes (the learning rate and factory arguments) of each problem point run
  as one vmapped program; ``score(metrics, run)`` rates a run with a tuple compared in order
  (higher is better: say the worst client's accuracy, then the average to break ties); a
  diverged run scores ``None``. Returns ``{"points": [{axis: value, ..., "score": s}],
  "best": point}`` (``None`` if every point diverged; the first of the best on full ties,
  so the smaller values win).
  """
  if method.uplink.get("privacy") or method.uplink.get("compression"):
    raise ValueError(f"--config.methods.{method.label}: a grid search picks settings on "
                     f"its runs, which spends privacy no accountant counts; search without "
                     f"privacy or compression")
  algorithm_names = [k for k in axes if k not in problem_axes]
  points = []
  for problem_values in itertools.product(*(axes[k] for k in problem_axes)):
    fixed = dict(zip(problem_axes, problem_values))
    kwargs = {**{k: v for k, v in method.kwargs.items() if k not in axes},
              **algorithm_kwargs(fixed)}
    if "local_steps" in inspect.signature(method.factory).parameters:
      kwargs["local_steps"] = method.local_steps
    result = fedco.sweep(make_problem(fixed), method.factory, data, params, rounds=rounds,
                         grid={k: axes[k] for k in algorithm_names}, seeds=(seed,),
                         algorithm_kwargs=kwargs, progress=progress, **simulator_kwargs)
    for r, run in enumerate(result.runs):
      value = None
      if result.diverged[r] is None:
        value = [float(v) for v in score(result.metrics, r)]
        value = value if np.all(np.isfinite(value)) else None
      points.append({**{k: run[k] for k in algorithm_names}, **fixed, "score": value})
  return {"points": points, "best": _best(points)}


def _best(points):
  finite = [p for p in points if p["score"] is not None]
  return max(finite, key=lambda p: p["score"]) if finite else None


def combine(searches: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
  """One method's searches on several seeds (same grid, same order) as one: a point's score
  is the mean of its scores, ``None`` if it diverged on any seed."""
  points = []
  for same in zip(*(s["points"] for s in searches)):
    scores = [p["score"] for p in same]
    score = (None if any(v is None for v in scores)
             else [float(v) for v in np.mean(np.asarray(scores), axis=0)])
    points.append({**same[0], "score": score, "per_seed": scores})
  return {"points": points, "best": _best(points)}


# ---- privacy and compression trade-offs ----------------------------------------------------

TRADEOFF_AXES = {"epsilon": ("privacy", "epsilon spent (delta in the method's settings)"),
                 "bytes_up": ("compression", "bytes sent up, whole run")}


def tradeoff(wd, methods: Sequence[Method], finals, x: str,
             panels: Sequence[tuple], name: str) -> Optional[Dict[str, Any]]:
  """The methods with ``privacy`` (``x="epsilon"``) or ``compression`` (``x="bytes_up"``)
  as trade-off curves: ``panels`` are ``(metric, axis label)`` pairs (or triples ending in
  ``"log"`` for a log y axis), one panel each, with
  each curve's points (mean over seeds, std bars) against ``x`` and its method without the
  setting as a dashed line. Saves ``name`` in ``wd``; returns the summary's ``tradeoff``
  entry (``None`` when no method has the setting)."""
  setting, xlabel = TRADEOFF_AXES[x]
  keys = [x] + [p[0] for p in panels]
  points = [m for m in methods if setting in m.uplink]
  if not points:
    return None
  per_run, _ = common.seed_statistics(finals, keys)  # no epsilon without privacy: None
  curves = list(dict.fromkeys(m.curve for m in points))
  reference = {c: next((m.label for m in methods if m.label == c and setting not in m.uplink),
                       None) for c in curves}
  rows = []
  for m in methods:
    if m.curve not in curves or m.label not in per_run:
      continue
    entry = per_run[m.label]
    rows.append({"curve": m.curve, "method": m.label,
                 **{k: entry[k]["mean"] for k in keys}, "diverged_seeds": entry["diverged_seeds"],
                 **{f"{k}_std": entry[k]["std"] for k in keys[1:]}})
  fig = common.figure(figsize=(5.5 * len(panels), 4.2))
  axes = np.atleast_1d(fig.subplots(1, len(panels)))
  for ax, (key, label, *scale) in zip(axes, panels):
    if scale == ["log"]:
      ax.set_yscale("log")
    for i, curve in enumerate(curves):
      color = f"C{i}"
      own = sorted((r for r in rows if r["curve"] == curve and r["method"] != reference[curve]
                    and r[x] is not None and r[key] is not None), key=lambda r: r[x])
      if own:
        ax.errorbar([r[x] for r in own], [r[key] for r in own],
                    yerr=[r[f"{key}_std"] or 0.0 for r in own], color=color, marker="o",
                    capsize=3, label=curve)
        if x == "bytes_up":  # which codec each point is
          for r in own:
            short = r["method"].removeprefix(curve + "_")
            if short == r["method"]:  # e.g. feddro_y3bit_adaptive on curve feddro_adaptive
              short = short.removeprefix(curve.split("_")[0] + "_")
            ax.annotate(short, (r[x], r[key]), fontsize=7,
                        xytext=(4, 4), textcoords="offset points", color=color)
      if not own and any(r["curve"] == curve and r["diverged_seeds"] for r in rows):
        ax.plot([], [], color=color, marker="x", ls="none",
                label=f"{curve} with {setting}: diverged")  # no point to draw, still named
      base = next((r for r in rows if r["method"] == reference[curve]), None)
      if base is not None and base[key] is not None:
        ax.axhline(base[key], color=color, ls="--", lw=1.0,
                   label=f"{curve} without {setting}")
        if base[x] is not None:  # the uncompressed run's own bytes
          ax.plot([base[x]], [base[key]], marker="*", ms=10, color=color, ls="none")
    ax.set_xscale("log")
    from matplotlib import ticker  # pylint: disable=g-import-not-at-top
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    if x == "epsilon":  # a few epsilons: label them as they are
      ax.set_xticks(sorted({r[x] for r in rows if r[x] is not None}))
      ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%.3g"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(label)
    ax.grid(alpha=0.3, which="both")
  common.save_with_legend(wd, fig, axes[0], name, legend=bool(axes[0].lines), fontsize=8)
  return {"x": x, "figure": name, "points": rows}
