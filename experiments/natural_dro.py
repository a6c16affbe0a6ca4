r"""E8: DRO-FL where clients really differ: natural partitions, one client per user.

E1 (quantity skew, the same label distribution everywhere) and Adult's doctorate client
have little distribution shift between clients, so reweighting clients raises the worst
client's *training* accuracy but not its held-out one. Here every client is a user with its
own data distribution and its own held-out examples: FedProx's Synthetic(alpha, beta)
(``dataset = "synthetic"``: each user's labelling model drawn around :math:`u_k \sim
N(0, \alpha^2)` and its inputs around :math:`B_k \sim N(0, \beta^2)`; a new draw per seed),
or FEMNIST's writers from LEAF's files (``"femnist"``, ``data_dir`` = LEAF's
``data/femnist/data``; the project's copy: ``natural_dro_femnist.py``), FedJAX's EMNIST-62
SQLite files (``"emnist"``, ``data_dir`` holding ``federated_emnist_{train,test}.sqlite``),
your own feature vectors in LEAF's JSON format (``"leaf"``, ``data_dir`` holding ``train/``
and ``test/``, ``num_classes``), or TFF's Shakespeare with one client per speaking role
(``"shakespeare"``, ``data_dir`` holding ``shakespeare_{train,test}.h5``, every role kept:
:func:`fedco.data.load_shakespeare_tff`; ``natural_dro_shakespeare.py``).

The model (``config.model``) is multinomial logistic regression (``"logistic"``, FedProx's
on Synthetic), for FEMNIST / EMNIST images optionally a small CNN (``"cnn"``:
:class:`fedco.models.CNN4` without normalisation, ``config.filters`` channels) or a
one-hidden-layer MLP (``"mlp"``, ``config.hidden_size`` units; its ``out`` layer is the
head FedRep and FedPer keep private), and for
Shakespeare a next-character LSTM (``"lstm"``: :class:`fedco.models.ShakespeareLSTM` with
``config.hidden_size`` units in ``config.num_layers`` layers). On Shakespeare an example
is one sequence of 80 characters, and its loss, the per-example loss every problem form
averages, is :func:`fedco.models.masked_cross_entropy`: the mean token cross-entropy over
its non-padding targets. A client's held-out accuracy is pooled over its tokens: its
correctly predicted scored targets (characters; pad, OOV, BOS and EOS left out as TFF and
FedJAX leave them out) over all its scored targets, not a mean over its sequences. Roles
with no scored held-out target (26 of the 715) have no held-out accuracy and are left out
of the held-out mean, worst and 10th percentile (``summary["heldout_clients"]`` counts the
clients scored); they still train and count in the training loss.

The methods are E1's
and Adult's: FedAvg (sample-weighted, and with every client weighted alike: the control
that tells reweighting by loss from merely not weighting by size), q-FedAvg, DRFL, AFL (no local steps: it runs
``rounds * local_steps`` rounds of one step), ComFedL normalised on the KL-DRO exp form and
FedDRO on its log form, all at the shared learning rate and local steps, every client in
every round, nothing tuned. Reported per evaluation: the clients' held-out accuracy (mean,
worst and 10th percentile over clients, each client counted once) and training loss; after
the runs each method's difference from each FedAvg run, paired by seed (same data, initial model):
mean, standard error and on how many seeds it is ahead.

    python -m experiments.main --config=experiments/configs/natural_dro.py --workdir=runs/e8
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

import fedco
from experiments import adult_dro, dro_fl
from fedco import extend, models
from fedco import metrics as metrics_lib
from fedco.algorithms import personal
from fedco.experiment import outputs, runner

DATASETS = ("synthetic", "femnist", "emnist", "leaf", "shakespeare")
# The models each dataset can train: the first is its default (config.model = "").
MODELS = {
  "synthetic": ("logistic",),
  "leaf": ("logistic",),
  "femnist": ("logistic", "cnn", "mlp"),
  "emnist": ("logistic", "cnn", "mlp"),
  "shakespeare": ("lstm",),
}
# Sequences evaluated together in the metrics (one [chunk, 80, 90] block of logits at a
# time, not all 37,784 training sequences' 1.1 GB at once).
EVAL_CHUNK = 512
KEYS = ("heldout_acc_worst", "heldout_acc_p10", "heldout_acc_avg")
TABLE_KEYS = KEYS + ("train_loss_worst",)
PROGRESS = "heldout_acc_worst"


def check(config) -> None:
  """The experiment's own fields (``ValueError`` naming ``--config.<field>``)."""
  extend.one_of("--config.dataset", config.dataset, DATASETS)
  if config.dataset == "synthetic" and config.data_dir:
    raise ValueError(
      f"--config.data_dir={config.data_dir!r} is read for femnist, emnist, leaf or "
      "shakespeare; synthetic is generated (your own LEAF files: --config.dataset=leaf)"
    )
  if config.model and config.model not in MODELS[config.dataset]:
    raise ValueError(
      f"--config.model={config.model!r} does not fit --config.dataset={config.dataset!r}: "
      f"one of {MODELS[config.dataset]} (or '': {MODELS[config.dataset][0]})"
    )
  for field in ("hidden_size", "num_layers", "filters"):
    extend.positive_int(f"--config.{field}", config[field])
  extend.positive_int("--config.num_classes", config.num_classes)
  if config.dataset != "synthetic" and not os.path.isdir(config.data_dir or ""):
    raise FileNotFoundError(
      f"--config.data_dir={config.data_dir!r} must be the folder of the {config.dataset} files "
      "(docs/data.md says how to prepare them)"
    )
  extend.positive("--config.gamma", config.gamma)
  extend.one_of("--config.compute_dtype", config.compute_dtype, ("float32", "bfloat16"))
  for field in ("alpha", "beta"):
    if not isinstance(config[field], (int, float)) or config[field] < 0:
      raise ValueError(f"--config.{field} must be a number >= 0, got {config[field]!r}")
  extend.positive_int("--config.num_users", config.num_users, minimum=0)
  extend.positive_int("--config.async_rounds", config.async_rounds, minimum=0)
  extend.positive_int("--config.async_eval_every", config.async_eval_every, minimum=0)
  check_warm_start(config.warm_start)
  delays(config)  # the simulated durations, built (a one-line error names the field)
  adult_dro.check_problems(config)


def check_warm_start(warm) -> None:
  """``config.warm_start``'s fields (one-line ``ValueError`` naming ``--config.warm_start.<field>``)."""
  where = "--config.warm_start"
  extend.positive_int(f"{where}.rounds", warm.rounds, minimum=0)
  for field in ("clients_per_round", "local_steps", "batch_size"):
    extend.positive_int(f"{where}.{field}", warm[field])
  extend.positive(f"{where}.learning_rate", warm.learning_rate)


def warm_start(warm, loss, fed, params, seed: int):
  """``params`` trained by FedAvg for ``warm.rounds`` rounds before any method starts.

  Every method of a seed then starts from the same trained model (``prepare``), so the
  comparison asks what each method does from a model past the plateau of the first rounds,
  which a compared method's own budget may not reach (Shakespeare's character models start
  by predicting the most frequent character everywhere). FedAvg samples
  ``warm.clients_per_round`` clients a round (examples-weighted), each taking
  ``warm.local_steps`` SGD steps of ``warm.batch_size`` examples at ``warm.learning_rate``;
  the seed draws the clients and batches. Deterministic: a resumed run recomputes it.

  Examples:
    >>> import jax.numpy as jnp
    >>> import ml_collections
    >>> import fedco
    >>> from experiments import natural_dro
    >>> x = jnp.arange(8.0).reshape(4, 2)
    >>> fed = fedco.FederatedData.from_clients([{"x": x + k} for k in range(3)])
    >>> warm = ml_collections.ConfigDict(
    ...   {"rounds": 3, "clients_per_round": 2, "local_steps": 2, "batch_size": 2, "learning_rate": 0.1}
    ... )
    >>> loss = lambda w, e: jnp.sum((w - e["x"]) ** 2)
    >>> trained = natural_dro.warm_start(warm, loss, fed, jnp.zeros(2), seed=0)
    >>> bool(jnp.all(trained > 0))  # moved toward the clients' points
    True
  """
  result = fedco.simulate(
    fedco.plain(loss, name="warm_start"),
    fedco.fedavg(warm.learning_rate, warm.local_steps),
    fed,
    params,
    rounds=warm.rounds,
    seed=seed,
    clients_per_round=warm.clients_per_round,
    batch_size=warm.batch_size,
    evaluate=False,
    progress=False,
    metric_labels={"method": "warm_start"},  # a Ctrl-C's line names the warm-up, not FedAvg
  )
  return result.params


def delays(config):
  """The runs' simulated durations (:class:`fedco.runtime.Delays` from ``config.delays``),
  or ``None`` when ``delays.step_time`` is 0 (no clock)."""
  spec = dict(config.delays)
  if not spec.get("step_time"):
    return None
  try:
    return fedco.runtime.Delays(**spec)
  except (TypeError, ValueError) as err:
    raise ValueError(f"--config.{err}") from None


def setup(config):
  """The files' clients, read once (Synthetic is drawn per seed in ``prepare``)."""
  if config.dataset == "synthetic":
    return None
  cap = config.num_users or None
  if config.dataset == "shakespeare":
    return fedco.data.load_shakespeare_tff(config.data_dir, max_clients=cap)
  if config.dataset in ("femnist", "leaf"):  # LEAF's Synthetic format: feature vectors
    kind = "femnist" if config.dataset == "femnist" else "synthetic"
    return fedco.data.load_leaf(config.data_dir, kind, num_classes=config.num_classes)
  files = [os.path.join(config.data_dir, f"federated_emnist_{s}.sqlite") for s in ("train", "test")]
  return fedco.data.load_sqlite(*files, "emnist", max_clients=cap)


@dataclasses.dataclass(frozen=True)
class PerSeed:
  """What one seed's runs share (``prepare``'s result).

  Attributes:
    fed: the seed's clients (a new Synthetic draw, or ``setup``'s from the files).
    params: the seed's initial model (trained by :func:`warm_start` when
      ``config.warm_start.rounds``).
    loss: the per-example training loss.
    stats: the per-example statistics of :func:`make_metrics_fn` (loss, accuracy; the
      LSTM's: loss, hits, scored targets).
    model: the model's name: ``"logistic"``, ``"cnn"`` or ``"lstm"``.
  """

  fed: fedco.data.FederatedDataset
  params: Any
  loss: Callable
  stats: Callable
  model: str


def prepare(config, seed, setup) -> PerSeed:
  """One seed's clients (a new Synthetic draw, or the files' clients) and initial model."""
  if setup is None:
    kwargs = {"num_users": config.num_users or 30, "seed": seed}
    fed = fedco.data.synthetic(float(config.alpha), float(config.beta), **kwargs)
  else:
    fed = setup
  kind = config.model or MODELS[config.dataset][0]
  if kind == "lstm":
    model, loss, stats = sequence_model(config.hidden_size, config.num_layers)
  elif kind == "cnn":
    model, loss, stats = cnn_model(fed.num_classes, config.filters)
  elif kind == "mlp":
    model, loss, stats = mlp_model(fed.num_classes, config.hidden_size)
  else:
    model, loss, stats = dro_fl.logistic_model(fed.num_classes)
  params = models.init_params(model, _image(fed.train.examples["x"][0], kind), seed)
  if config.warm_start.rounds:
    if config.warm_start.clients_per_round > fed.num_clients:
      raise ValueError(
        f"--config.warm_start.clients_per_round={config.warm_start.clients_per_round} "
        f"exceeds the {fed.num_clients} clients"
      )
    params = warm_start(config.warm_start, loss, fed.train, params, seed)
  return PerSeed(fed=fed, params=params, loss=loss, stats=stats, model=kind)


def _image(x, kind):
  """One example's input as ``kind`` takes it (the CNN: a ``[28, 28, 1]`` image; the MLP:
  its pixels as one vector)."""
  if kind == "cnn":
    return jnp.reshape(x, (28, 28, 1))
  return jnp.reshape(x, (-1,)) if kind == "mlp" else x


def cnn_model(num_classes: int, filters: int):
  """A small image model and its per-example ``loss`` and ``stats`` (loss, accuracy):
  :class:`fedco.models.CNN4` without normalisation (four conv-ReLU-pool blocks of
  ``filters`` channels, then logits) on each 784-pixel example as a 28x28 image."""
  model = models.CNN4(num_classes=num_classes, filters=filters, norm="none")
  return (model, *_classifier(model, "cnn"))


def mlp_model(num_classes: int, hidden_size: int):
  """One hidden ReLU layer of ``hidden_size`` units, then logits (:class:`fedco.models.MLP`:
  layers ``hidden_0`` and ``out``, the head FedRep and FedPer keep private), with its
  per-example ``loss`` and ``stats`` (loss, accuracy)."""
  model = models.MLP(hidden=(hidden_size,), out=num_classes)
  return (model, *_classifier(model, "mlp"))


def _classifier(model, kind: str):
  """``(loss, stats)`` of an image classifier reading each example as ``kind`` takes it."""

  def loss(params, example):
    return models.cross_entropy(model.apply(params, _image(example["x"], kind)), example["y"])

  def stats(params, example):
    logits = model.apply(params, _image(example["x"], kind))
    return models.cross_entropy(logits, example["y"]), models.accuracy(logits, example["y"])

  return loss, stats


def sequence_model(hidden_size: int = 32, num_layers: int = 1):
  """The Shakespeare LSTM and its per-sequence ``loss`` and ``stats``, the interface of
  :func:`experiments.dro_fl.logistic_model` for one example that is a sequence.

  ``loss(params, example)`` is the sequence's masked token cross-entropy (the mean over
  its targets that are not padding); ``stats`` gives that loss, the number of its scored
  targets that the model predicts (characters only: pad, OOV, BOS and EOS left out) and
  the number of scored targets, so a client's means of the last two divide to its
  accuracy pooled over its tokens.

  Examples:
    A sequence's loss is the mean over its two non-padding targets:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> from experiments import natural_dro
    >>> model, loss, stats = natural_dro.sequence_model(hidden_size=4)
    >>> example = {"x": jnp.array([88, 5, 7, 0]), "y": jnp.array([5, 7, 0, 0])}
    >>> params = model.init(jax.random.PRNGKey(0), example["x"])
    >>> value, hits, scored = stats(params, example)
    >>> bool(jnp.isclose(value, loss(params, example))), float(scored)
    (True, 2.0)
  """
  model = models.ShakespeareLSTM(hidden_size=hidden_size, num_layers=num_layers)
  tff = fedco.data.tff

  def loss(params, example):
    return tff.shakespeare_loss(model.apply(params, example["x"]), example["y"])

  def stats(params, example):
    logits = model.apply(params, example["x"])
    value = tff.shakespeare_loss(logits, example["y"])
    count = jnp.sum(tff.shakespeare_scored(example["y"])).astype(jnp.float32)
    return value, tff.shakespeare_accuracy(logits, example["y"]) * count, count

  return model, loss, stats


def client_means(fn, params, data, chunk: int = EVAL_CHUNK):
  """:func:`fedco.metrics.per_client_mean` evaluated ``chunk`` examples at a time
  (``jax.lax.map``), so a large held-out or training set's intermediate values (a
  sequence model's logits) never all exist at once."""
  examples = jax.tree.map(lambda a: a[data.flat_rows], data.examples)
  values = jax.lax.map(lambda e: fn(params, e), examples, batch_size=chunk)
  weights = data.flat_weights()
  return jax.tree.map(
    lambda v: jax.ops.segment_sum(
      weights.astype(v.dtype) * v, data.flat_owner, num_segments=data.num_clients
    ),
    values,
  )


def make_metrics_fn(stats, pooled: bool = False):
  """Held-out accuracy over clients (mean, worst, 10th percentile) and training loss.

  ``pooled``: ``stats`` gives (loss, hits, scored) per example and a client's accuracy is
  its hits over its scored targets; clients with nothing scored are left out of the
  held-out values (NaN, skipped by ``nanmin``/``nanquantile``/``nanmean``)."""

  def metrics_fn(p, d):
    held_out, train = (client_stats(stats, p, d[k], pooled) for k in ("val", "train"))
    return _summary(held_out, train, pooled)

  return metrics_fn


def client_stats(stats, params, data, pooled: bool):
  """Each client's mean of ``stats`` (chunked where a sequence model's are pooled)."""
  if pooled:
    return client_means(stats, params, data)
  return metrics_lib.per_client_mean(stats, params, data)


def _accuracies(held_out, pooled: bool) -> jax.Array:
  """Each client's held-out accuracy (NaN where a pooled client scored nothing)."""
  if not pooled:
    return held_out[1]
  _, hits, scored = held_out
  return jnp.where(scored > 0, hits / jnp.where(scored > 0, scored, 1.0), jnp.nan)


def _reducers(pooled: bool):
  """Mean, minimum and quantile over clients (NaN-skipping where pooled clients may have
  scored nothing)."""
  return (jnp.nanmean, jnp.nanmin, jnp.nanquantile) if pooled else (jnp.mean, jnp.min, jnp.quantile)


def _summary(held_out, train, pooled: bool) -> Dict[str, jax.Array]:
  """The metrics from each client's mean statistics on its held-out and training rows."""
  accs, losses = _accuracies(held_out, pooled), train[0]
  mean, low, quantile = _reducers(pooled)
  return {
    "heldout_acc_avg": mean(accs),
    "heldout_acc_worst": low(accs),
    "heldout_acc_p10": quantile(accs, 0.1),
    "train_loss_avg": jnp.mean(losses),
    "train_loss_worst": jnp.max(losses),
  }


def personal_evaluation(algorithm, stats, fed, pooled: bool = False):
  """``evaluate(state) -> row``: the metrics of :func:`make_metrics_fn` with every client
  scored by its own model (:func:`fedco.algorithms.personal.personal_model`: FedRep's and
  FedPer's heads, APFL's mixture, Ditto's personal model), and the shared model's held-out
  mean beside them (``heldout_acc_global_avg``)."""

  @jax.jit
  def compute(server, clients):
    models = personal.personal_models(algorithm, server, clients)
    held_out = metrics_lib.per_client_models_mean(stats, models, fed.val)
    train = metrics_lib.per_client_models_mean(stats, models, fed.train)
    row = _summary(held_out, train, pooled)
    shared = _accuracies(client_stats(stats, server, fed.val, pooled), pooled)
    row["heldout_acc_global_avg"] = _reducers(pooled)[0](shared)
    return row

  def evaluate(state):
    row = jax.device_get(compute(state.server["params"], state.clients))
    return {k: float(v) for k, v in row.items()}

  return evaluate


def build(config, method, seed, prepared) -> runner.Run:
  """One method's problem form and algorithm; AFL (one local step) runs ``rounds *
  local_steps`` rounds."""
  del seed
  fed = prepared.fed
  problem, algorithm, scale = adult_dro.problem_and_algorithm(
    config, method, prepared.loss, fed.num_clients, "cross_entropy"
  )
  problem = fedco.problems.mixed_precision(problem, config.compute_dtype)
  pooled = prepared.model == "lstm"
  simulate: Dict[str, Any] = {"evaluate": False}
  timed = delays(config)
  rounds, eval_every = config.rounds, config.eval_every
  if timed is not None:  # a clock: each round's simulated time is recorded
    simulate["delays"] = timed
    if method.uplink.get("asynchronous"):
      rounds = config.async_rounds or rounds
      eval_every = config.async_eval_every or eval_every
  if method.algorithm in personal.PERSONAL:  # scored with each client's own model
    evaluation = {"evaluate": personal_evaluation(algorithm, prepared.stats, fed, pooled)}
  else:
    evaluation = {
      "metrics_fn": make_metrics_fn(prepared.stats, pooled=pooled),
      "metrics_data": {"train": fed.train, "val": fed.val},
    }
  return runner.Run(
    problem,
    algorithm,
    fed.train.with_owner(),  # the log form's inner function reads each example's client
    prepared.params,
    rounds=rounds * scale,
    eval_every=eval_every * scale,
    simulate=simulate,
    record_keys=KEYS + (("time",) if timed is not None else ()),
    **evaluation,
  )


def against_fedavg(per_method, baselines) -> Dict[str, Any]:
  """``{baseline: {method: {key: ...}}}``: each other method's final ``KEYS`` minus each
  FedAvg run's (``baselines``: their labels), paired by seed over the seeds both finished:
  mean, standard error (``None`` with one seed), seeds and seeds ahead."""
  done = lambda e, s: "diverged" not in e["per_seed"].get(s, {"diverged": True})
  out: Dict[str, Any] = {}
  for base_label in baselines:
    base = per_method[base_label]
    out[base_label] = {}
    for label, entry in per_method.items():
      if label in baselines:
        continue
      seeds = [s for s in entry["per_seed"] if done(entry, s) and done(base, s)]
      out[base_label][label] = {}
      for key in KEYS:
        d = np.array([entry["per_seed"][s][key] - base["per_seed"][s][key] for s in seeds])
        out[base_label][label][key] = {
          "difference": float(d.mean()) if d.size else None,
          "stderr": outputs.standard_error(d),
          "seeds": len(seeds),
          "seeds_ahead": int((d > 0).sum()),
        }
  return out


def summarize(config, outcome) -> Dict[str, Any]:
  fed = outcome.setup
  summary: Dict[str, Any] = {"dataset": config.dataset, "gamma": config.gamma}
  if fed is None:
    summary.update(alpha=config.alpha, beta=config.beta, users=config.num_users or 30)
  else:
    summary.update(users=fed.num_clients, dropped_users=fed.info.get("dropped_users", 0))
    if config.dataset == "shakespeare":  # roles with a scored held-out target
      scored = fedco.data.tff.shakespeare_scored(fed.val.examples["y"]).sum(axis=1)
      per_client = np.bincount(
        np.asarray(fed.val.flat_owner),
        weights=scored[np.asarray(fed.val.flat_rows)],
        minlength=fed.num_clients,
      )
      summary["heldout_clients"] = int((per_client > 0).sum())
  summary["model"] = config.model or MODELS[config.dataset][0]
  if config.warm_start.rounds:
    summary["warm_start"] = config.warm_start.to_dict()
  baselines = [
    m.label for m in outcome.methods if m.algorithm == "fedavg" and not m.uplink.get("asynchronous")
  ]
  summary["against_fedavg"] = against_fedavg(outcome.per_method, baselines)
  if delays(config) is not None:
    summary["simulated_time"] = against_time(outcome.records, outcome.labels, baselines[:1])
  return summary


def _timelines(records, label):
  """``{seed: [(time, row), ...]}`` of a method's evaluated rows, in time order."""
  out: Dict[Any, list] = {}
  for r in records:
    if r["method"] == label and np.isfinite(r.get("time", np.nan)):
      out.setdefault(r["seed"], []).append((r["time"], r))
  return {seed: sorted(rows, key=lambda t: t[0]) for seed, rows in out.items()}


def _mean_se(values) -> Dict[str, Any]:
  return {**outputs.mean_and_stderr(values), "seeds": len(values)}


def against_time(records, labels, baselines) -> Dict[str, Any]:
  """The methods compared by simulated time (``delays``): per method, the time its runs
  ended; ``KEYS`` at the common budget (the earliest end of any run: each run's last
  evaluation at or before it; ``None`` where a run has none) and at the first synchronous FedAvg's last round (as many
  reports applied); and, paired by seed with that FedAvg (``baselines[0]``), the time each
  method first reached FedAvg's final mean held-out accuracy on the seed, and FedAvg's time
  over it (``None`` where a seed never reached it)."""
  lines = {label: _timelines(records, label) for label in labels}
  lines = {label: by for label, by in lines.items() if by}
  if not lines:
    return {}
  budget = min(rows[-1][0] for by in lines.values() for rows in by.values())
  base = lines.get(baselines[0]) if baselines else None
  out: Dict[str, Any] = {"budget": float(budget), "methods": {}}
  if base is not None:
    out["baseline"] = baselines[0]
    out["baseline_rounds"] = max(rows[-1][1]["round"] for rows in base.values())

  def reached(rows, seed):  # the first time this run reached FedAvg's final accuracy
    target = base[seed][-1][1]["heldout_acc_avg"]
    return next((t for t, r in rows if r["heldout_acc_avg"] >= target), None)

  for label, by in lines.items():
    entry: Dict[str, Any] = {"end_time": _mean_se([rows[-1][0] for rows in by.values()])}
    at = [next((r for t, r in reversed(rows) if t <= budget), None) for rows in by.values()]
    entry["at_budget"] = (  # None: a run's first evaluation came after the budget
      None if None in at else {key: _mean_se([r[key] for r in at]) for key in KEYS}
    )
    if base is None:
      out["methods"][label] = entry
      continue
    same = [r for rows in by.values() for _, r in rows if r["round"] == out["baseline_rounds"]]
    if len(same) == len(by):
      entry["at_baseline_rounds"] = {key: _mean_se([r[key] for r in same]) for key in KEYS}
    seeds = [s for s in by if s in base]
    times = [reached(by[s], s) for s in seeds]
    if seeds and None not in times:
      entry["time_to_baseline"] = _mean_se(times)
      entry["speedup"] = _mean_se([reached(base[s], s) / t for s, t in zip(seeds, times)])
    out["methods"][label] = entry
  return out


def report(summary) -> List[str]:
  """One line per method and FedAvg run: held-out accuracy minus FedAvg's, paired by seed;
  with ``delays``, one per method by simulated time."""
  lines = []
  timed = summary.get("simulated_time") or {}
  for label, entry in timed.get("methods", {}).items():
    line = f"{label}: runs end at simulated time {entry['end_time']['mean']:.0f}"
    if entry["at_budget"] is not None:
      line += (
        f"; at {timed['budget']:.0f}, mean held-out accuracy "
        f"{entry['at_budget']['heldout_acc_avg']['mean']:.3f}"
      )
    if "speedup" in entry:
      line += (
        f"; reaches {timed['baseline']}'s final accuracy at "
        f"{entry['time_to_baseline']['mean']:.0f}, {entry['speedup']['mean']:.2f}x sooner"
      )
    lines.append(line)
  for base, methods in summary["against_fedavg"].items():
    for label, keys in methods.items():
      cells = []
      for key, d in keys.items():
        if d["difference"] is None:
          continue
        err = f" +- {d['stderr']:.3f}" if d["stderr"] is not None else ""
        cells.append(f"{key[12:]} {d['difference']:+.3f}{err} ({d['seeds_ahead']}/{d['seeds']})")
      if cells:
        lines.append(f"{label} - {base}, held-out accuracy paired by seed: {', '.join(cells)}")
  return lines


def plot(wd, config, outcome):
  """Held-out accuracy against local steps per client, so AFL's one-step rounds and the
  others' ``local_steps``-step rounds share the axis."""
  steps = {}
  for m in outcome.methods:
    algorithm = m.build(**({"gamma": config.gamma} if m.kwargs.get("normalized") else {}))
    steps[m.label] = algorithm.plan.local_steps
  panels = tuple(
    (key, f"held-out accuracy, {who}")
    for key, who in zip(KEYS, ("worst client", "10th percentile client"))
  )
  fig = outputs.curves(
    outcome.records,
    outcome.labels,
    panels,
    title=config.dataset,
    x="local steps per client",
    steps=steps,
    finals=outcome.finals,
  )
  wd.save_figure(fig, "natural_dro.png")
  if delays(config) is not None:
    panels = (("heldout_acc_avg", "mean held-out accuracy"),) + panels[1:]
    fig = outputs.curves(
      outcome.records,
      outcome.labels,
      panels,
      title=config.dataset,
      x="simulated time (mean over seeds)",
      x_key="time",
      finals=outcome.finals,
    )
    wd.save_figure(fig, "natural_dro_time.png")
