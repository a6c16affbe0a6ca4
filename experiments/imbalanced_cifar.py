r"""E5: imbalanced image classification, CIFAR10-ST / CIFAR100-ST (paper 004 Sec. 6, SPEC E5).

The step-imbalanced training split (the first half of the classes keep their last
``config.keep_fraction`` (2%) of images, :mod:`fedco.data.imbalanced`) is split equally at
random over ``config.num_clients`` (8) clients. The problem is sample-level KL-DRO (SPEC 4.2,
global-inner)::

    min_x  lam log( 1/N sum_i exp(l_i(x) / lam) )       g = mean_i exp((l_i - shift)/lam), f = lam log

with ``l_i`` the cross-entropy of a ResNet20 (flax, GroupNorm: fedco's losses are
per-example, see :mod:`fedco.models.resnet`; ``config.model``). The compared methods are
``config.methods`` (label: settings):

* ``feddro``: FedDRO (paper 004, Alg. 2), ``beta = 0.5``, ``config.local_steps = 1``;
* ``ds_feddro``: DS-FedDRO (Alg. 3), server rates ``server_lr_x = 1.3``,
  ``server_lr_y = 1.4``;
* ``fastdro``: FastDRO (Levy et al. 2020), chi^2 ball (``geometry``, ``size``), in parallel
  form: each client's best response on its own batch;
* ``primal_dual_dro``: primal-dual SGD (weights on all N training rows, projected ascent at
  ``weights_lr = 1e-4``);
* ``mbsgd``: minibatch SGD for CO (one step per round);
* ``fedavg_co``: FedAvg for CO, Case II, 5 local steps (the failing baseline of
  Theorem 4.1).

FastDRO and primal-dual SGD solve the DRO problem over their own example weights, on the
plain cross-entropy; the others get the KL-DRO problem. "Centralised baselines in parallel
form" (paper 004): every method uses ``K`` clients x ``batch_size`` (16) examples per step,
so they all see the same number of examples per step. Every rate is
``config.learning_rate`` (or a method's own; the paper picks one of {0.001, 0.01, 0.05, 0.1})
divided by 10 after ``config.lr_drop_round`` (90) rounds, through an optax schedule counted
in local steps.

Reported at round 1 and every ``config.eval_every`` rounds (streamed to ``metrics.jsonl`` /
``metrics.csv`` while runs go, one row per ``method``, ``seed`` and round): top-1 accuracy on
the training split (the imbalanced one) and the test split, the test accuracy of the
minority half of the classes, and the KL-DRO objective on each split.
``config.ablation = "local_steps"`` runs the ``feddro`` / ``ds_feddro`` methods over
``config.ablation_values`` (default ``1, 2, 4, 8, 16, 32``; the paper's ablation), labelled
``<label>_local_steps=<I>``. 3 seeds; the table holds mean +- std over them.

    python -m experiments.main --config=experiments/configs/imbalanced_cifar.py \
        --workdir=runs/e5 --config.data_dir=~/tensorflow_datasets
    python -m experiments.main --config=experiments/configs/imbalanced_cifar.py \
        --workdir=runs/e5_100 --config.dataset=cifar100
    python -m experiments.main --config=experiments/configs/imbalanced_cifar.py \
        --workdir=runs/e5_I --config.ablation=local_steps
    python -m experiments.main --config=experiments/configs/imbalanced_cifar.py \
        --workdir=runs/e5_digits --config.dataset=digits --config.rounds=200
        # offline stand-in (digits-ST), minutes

CIFAR needs the TFDS data prepared in ``array_record`` format (see :mod:`fedco.data.sources`);
a ResNet20 step on 128 images is about a second on a 2-core CPU, so the paper-sized runs are
for an accelerator. Writes ``config.json``, ``metrics.jsonl``, ``metrics.csv``,
``summary.json`` (per method: the final metrics of each seed, their mean and std, and the
method's settings) and ``accuracy.png`` (four panels against rounds: train and test
accuracy, minority-class test accuracy, train objective; mean +- std over seeds).
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np
import optax
from matplotlib.ticker import MaxNLocator

import fedco
from experiments import common, runner
from fedco.data import imbalanced, partition, sources
from fedco.models import CNN4, LogisticRegression, ResNet20, accuracy, cross_entropy
from fedco.models.layers import CONV_IMPLS

# The algorithms E5 compares, and the problem each one solves: FastDRO and primal-dual SGD
# weight the examples themselves (on the plain loss), the others get the KL-DRO problem.
PROBLEMS = {"feddro": "kl_dro", "ds_feddro": "kl_dro", "mbsgd": "kl_dro",
            "fedavg_co": "kl_dro", "fastdro": "erm", "primal_dual_dro": "erm"}
LOCAL = ("feddro", "ds_feddro")  # the algorithms of the local_steps ablation
ABLATION_DEFAULT = (1, 2, 4, 8, 16, 32)
MODELS = ("resnet20", "cnn4", "linear")
TABLE_KEYS = ("test_acc", "train_acc", "test_minority_acc", "train_objective")
_EVAL_CHUNK = 256
# Line styles and markers cycled over the methods, so lines that coincide stay visible.


def check(config) -> Dict[str, Any]:
  """The checked settings (``ValueError`` naming ``--config.<field>``); runs nothing."""
  settings = runner.check_shared(config)
  if config.dataset not in imbalanced.ST_DATASETS:
    raise ValueError(f"--config.dataset must be one of {imbalanced.ST_DATASETS}, got "
                     f"{config.dataset!r}")
  if not isinstance(config.data_dir, str):
    raise ValueError(f"--config.data_dir must be a folder path (or empty: TFDS's default), "
                     f"got {config.data_dir!r}")
  if config.model not in MODELS:
    raise ValueError(f"--config.model must be one of {MODELS}, got {config.model!r}")
  if config.conv_impl not in CONV_IMPLS:
    raise ValueError(f"--config.conv_impl must be one of {CONV_IMPLS}, got "
                     f"{config.conv_impl!r}")
  for name in ("width", "num_clients", "lr_drop_round"):
    common.check_int(f"config.{name}", config[name], 1)
  common.check_int("config.eval_examples", config.eval_examples, 0)
  common.check_positive("config.lam", config.lam)
  common.check_real("config.shift", config.shift)
  common.check_real("config.keep_fraction", config.keep_fraction, low=0.0, high=1.0)
  methods = runner.methods(config)
  for m in methods:
    where = f"--config.methods.{m.label}"
    if m.algorithm not in PROBLEMS:
      raise ValueError(f"{where}.algorithm must be one of {tuple(PROBLEMS)} (E5's methods), "
                       f"got {m.algorithm!r}")
    if "num_examples" in m.kwargs:
      raise ValueError(f"{where}.num_examples is set by the experiment (the training rows); "
                       "leave it out")
    if "beta" in m.kwargs:
      common.check_real(f"config.methods.{m.label}.beta", m.kwargs["beta"], low=0.0, high=1.0)
    if m.algorithm == "fastdro":
      geometry, size = m.kwargs.get("geometry", "chi2"), m.kwargs.get("size", 1.0)
      if geometry not in ("chi2", "cvar"):
        raise ValueError(f"{where}.geometry must be 'chi2' or 'cvar', got {geometry!r}")
      if geometry == "cvar":
        common.check_real(f"config.methods.{m.label}.size", size, low=0.0, high=1.0)
      else:
        common.check_positive(f"config.methods.{m.label}.size", size)
    for name in ("server_lr_x", "server_lr_y", "weights_lr"):
      if name in m.kwargs:
        common.check_positive(f"config.methods.{m.label}.{name}", m.kwargs[name])
  values = runner.ablation(config, {"local_steps": ABLATION_DEFAULT})
  if values and not any(m.algorithm in LOCAL for m in methods):
    raise ValueError("--config.ablation=local_steps needs a feddro or ds_feddro method in "
                     "--config.methods")
  return {**settings, "methods": methods, "ablation_values": values}


def runs(settings) -> List[runner.Method]:
  """The methods run: the config's, or the feddro / ds_feddro ones once per ablation value."""
  if not settings["ablation_values"]:
    return list(settings["methods"])
  return [m.variant(f"{m.label}_local_steps={v}", local_steps=v)
          for m in settings["methods"] if m.algorithm in LOCAL
          for v in settings["ablation_values"]]


def load(config):
  """The step-imbalanced train split and the test split; a TFDS data set that is not prepared
  is a one-line ``FileNotFoundError`` naming the offline alternative."""
  try:
    return imbalanced.load_st(config.dataset, config.data_dir or None,
                              keep_fraction=config.keep_fraction)
  except FileNotFoundError as err:
    lines = str(err).splitlines()
    reason = (lines[0].split(" To prepare")[0].strip() if lines else "").rstrip(".")
    raise FileNotFoundError(
        f"--config.dataset={config.dataset}: {reason or 'the TFDS data set is not prepared'}. "
        f"Prepare it (tfds build {config.dataset} --file_format=array_record; see "
        f"fedco.data.sources) and pass --config.data_dir, or run offline with "
        f"--config.dataset=digits") from None


def make_model(config, num_classes: int):
  if config.model == "resnet20":
    return ResNet20(num_classes=num_classes, width=config.width, conv_impl=config.conv_impl)
  if config.model == "cnn4":
    return CNN4(num_classes=num_classes, conv_impl=config.conv_impl)
  return LogisticRegression(num_classes)


def schedule(config, method: runner.Method):
  """The method's rate, divided by 10 after ``config.lr_drop_round`` rounds (counted in its
  local steps: 1 for a method without them)."""
  steps = (method.local_steps if "local_steps" in inspect.signature(method.factory).parameters
           else 1)
  return optax.piecewise_constant_schedule(method.learning_rate,
                                           {config.lr_drop_round * steps: 0.1})


def make(method: runner.Method, config, loss, num_examples: int):
  """The problem and algorithm of one run."""
  if PROBLEMS[method.algorithm] == "erm":
    problem = fedco.plain(loss)
  else:
    problem = fedco.problems.sample_kl_dro(loss, config.lam, shift=config.shift)
  extra = {"num_examples": num_examples} if method.algorithm == "primal_dual_dro" else {}
  return problem, method.build(learning_rate=schedule(config, method), **extra)


def as_images(split):
  """Flat square grey images (digits' 64 pixels) as ``[N, side, side, 1]`` for the conv nets."""
  x = split["x"]
  if x.ndim == 2:
    side = int(round(np.sqrt(x.shape[1])))
    if side * side != x.shape[1]:
      raise ValueError(f"cannot read {x.shape[1]} features as a square image")
    x = x.reshape(x.shape[0], side, side, 1)
  return {**split, "x": x}


def _subset(split, n, seed):
  if not n or n >= len(split["y"]):
    return split
  rows = np.sort(np.random.default_rng(seed).choice(len(split["y"]), n, replace=False))
  return {k: v[rows] for k, v in split.items()}


def metrics_fn_for(apply_fn, train, test, num_classes, config):
  """Top-1 accuracy (train, test, test minority half) and the train KL-DRO objective."""
  splits = {}
  for name, split in (("train", train), ("test", test)):
    split = _subset(split, config.eval_examples, 0)
    n = len(split["y"])
    pad = (-n) % _EVAL_CHUNK
    x = np.concatenate([split["x"], np.zeros((pad,) + split["x"].shape[1:], split["x"].dtype)])
    y = np.concatenate([split["y"], np.zeros(pad, split["y"].dtype)])
    real = np.arange(n + pad) < n
    splits[name] = tuple(jnp.asarray(a.reshape((-1, _EVAL_CHUNK) + a.shape[1:]))
                         for a in (x, y, real))
  lam, minority = config.lam, num_classes // 2

  def per_split(params, x, y, real):
    def chunk(args):
      xc, yc = args
      logits = jax.vmap(lambda xi: apply_fn(params, xi))(xc)
      return (jax.vmap(cross_entropy)(logits, yc), jax.vmap(accuracy)(logits, yc))

    losses, accs = jax.lax.map(chunk, (x, y))
    losses, accs, real_, y_ = losses.ravel(), accs.ravel(), real.ravel(), y.ravel()
    count = jnp.sum(real_)
    acc = jnp.sum(jnp.where(real_, accs, 0.0)) / count
    low = real_ & (y_ < minority)
    minority_acc = jnp.sum(jnp.where(low, accs, 0.0)) / jnp.maximum(jnp.sum(low), 1)
    big = jnp.where(real_, losses / lam, -jnp.inf)
    objective = lam * (jax.nn.logsumexp(big) - jnp.log(count))
    return acc, minority_acc, objective

  def metrics_fn(params):
    out = {}
    for name, (x, y, real) in splits.items():
      acc, minority_acc, objective = per_split(params, x, y, real)
      out[f"{name}_acc"] = acc
      out[f"{name}_minority_acc"] = minority_acc
      out[f"{name}_objective"] = objective
    return out

  return metrics_fn


def run(config, workdir, options: runner.Options = runner.Options()) -> Dict[str, Any]:
  """Runs E5 (or its ablation over local steps) and writes the outputs; returns the summary."""
  start = time.perf_counter()
  settings = check(config)
  train, test = load(config)
  num_classes = sources.num_classes(config.dataset)
  if config.model != "linear":
    train, test = as_images(train), as_images(test)
  wd = common.Workdir(workdir)
  wd.write_config(config.to_dict())
  common.start_checkpoints(wd, {"resume": options.resume})
  writers = runner.Writers(wd)
  model = make_model(config, num_classes)
  apply_fn = model.apply
  loss = lambda params, e: cross_entropy(apply_fn(params, e["x"]), e["y"])
  metrics_fn = metrics_fn_for(apply_fn, train, test, num_classes, config)
  examples = {"x": jnp.asarray(train["x"]), "y": jnp.asarray(train["y"])}
  # What shapes a run besides its method and seed (its checkpoint hash).
  shared = {k: v for k, v in config.to_dict().items()
            if k not in ("seeds", "methods", "ablation", "ablation_values", "learning_rate",
                         "local_steps")}
  methods = runs(settings)
  records, finals = [], {}
  for seed in settings["seeds"]:
    parts = partition.iid(len(train["y"]), config.num_clients, seed)
    data = fedco.FederatedData.from_index_lists(examples, parts)
    params = model.init(jax.random.PRNGKey(seed), examples["x"][0])
    for method in methods:
      problem, algorithm = make(method, config, loss, len(train["y"]))
      runner.simulate_method(
          method, seed, problem=problem, algorithm=algorithm, data=data, params=params,
          wd=wd, options=options, writers=writers, settings=shared, finals=finals,
          records=records, progress_metric="test_acc", rounds=settings["rounds"],
          batch_size=settings["batch_size"] or None, evaluate=False,
          eval_every=settings["eval_every"], metrics_fn=metrics_fn)
  summary = summarize(finals, settings, config, methods, time.perf_counter() - start,
                      {"train_examples": int(len(train["y"])),
                       "test_examples": int(len(test["y"])), "num_classes": num_classes})
  fig, legend_ax = plot(records, config, [m.label for m in methods])
  common.save_with_legend(wd, fig, legend_ax, "accuracy.png", legend=bool(legend_ax.lines),
                          fontsize=8)
  wd.write_summary(summary)
  if options.progress:
    print(common.format_table(summary["table"]))
    print(f"wall time {summary['seconds']:.1f} s")
  return summary


def summarize(finals, settings, config, methods, seconds, data) -> Dict[str, Any]:
  per_method, table = common.seed_statistics(finals, TABLE_KEYS)
  return {"dataset": f"{config.dataset}-ST", "model": config.model,
          "rounds": settings["rounds"], "num_clients": config.num_clients,
          "seeds": list(settings["seeds"]), "data": data, "methods": per_method,
          "table": table, "settings": {m.label: m.settings() for m in methods},
          "seconds": seconds}


# What a panel's value is, and why it can be 0 everywhere (written in an all-zero panel).
PANELS = (("train_acc", "train accuracy", ""),
          ("test_acc", "test accuracy", ""),
          ("test_minority_acc", "test accuracy, minority classes",
           "the test accuracy on the minority classes (the first half, {keep:g}% of their "
           "training images kept)\nis 0 for every method at every evaluation: no method "
           "predicts a minority class\nat this budget (more rounds, or a smaller "
           "imbalance, are needed)"),
          ("train_objective", "train KL-DRO objective", ""))


def plot(records, config, labels):
  """The four panels against rounds; returns ``(figure, legend axes)``. One line per method
  (mean over seeds, +- std band), each with its own line style and marker; a panel whose
  values are all 0 (or missing) says what it measures and why instead of drawing flat
  lines."""
  fig = common.figure(figsize=(11, 8))
  axes = fig.subplots(2, 2)
  drawn = [label for label in labels if any(r["method"] == label for r in records)]
  for ax, (key, title, why_zero) in zip(axes.ravel(), PANELS):
    values = [r.get(key) for r in records if r["method"] in drawn]
    finite = [v for v in values if v is not None and np.isfinite(v)]
    ax.set_xlabel("round")
    ax.set_ylabel(title)
    ax.set_title(f"{config.dataset}-ST, {config.num_clients} clients: {title}", fontsize=10)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not finite or not any(finite):  # nothing to draw but flat or missing lines: say why
      if finite and why_zero:
        text = why_zero.format(keep=100 * config.keep_fraction)
      elif finite:
        text = f"{title}: 0 for every method at every evaluation"
      else:
        text = f"{title}: no finite evaluation (every run diverged at once)"
      rounds = [r["round"] for r in records]
      if rounds:
        ax.set_xlim(min(rounds), max(max(rounds), min(rounds) + 1))
      ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=8)
      continue
    for i, label in enumerate(drawn):
      common.plot_mean_curves(ax, records, key, labels=[label], band=0.15, group="method",
                              skip_missing=True)
      common.distinguish(ax.lines[-1], i)  # FedDRO and MBSGD can coincide: both stay visible
    ax.grid(alpha=0.3)
  legend_ax = next((ax for ax in axes.ravel() if ax.lines), axes[0, 0])
  return fig, legend_ax
