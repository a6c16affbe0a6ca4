r"""E5: imbalanced image classification, CIFAR10-ST / CIFAR100-ST (paper 004 Sec. 6, SPEC E5).

The step-imbalanced training split (the first half of the classes keep their last
``config.keep_fraction`` (2%) of images, :mod:`fedco.data.imbalanced`) is split equally at
random over ``config.num_clients`` (8) clients. The problem is sample-level KL-DRO (SPEC 4.2,
global-inner)::

    min_x  lam log( 1/N sum_i exp(l_i(x) / lam) )     g = mean_i exp((l_i - shift)/lam), f = lam log

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
plain cross-entropy (so does any method of plain problems); the others (compositional ones,
yours too) get the KL-DRO problem. "Centralised baselines in parallel
form" (paper 004): every method uses ``K`` clients x ``batch_size`` (16) examples per step,
so they all see the same number of examples per step. Every rate is
``config.learning_rate`` (or a method's own; the paper picks one of {0.001, 0.01, 0.05, 0.1})
divided by 10 after ``config.lr_drop_round`` (90) rounds, through an optax schedule counted
in local steps.

Reported at round 1 and every ``config.eval_every`` rounds: top-1 accuracy on
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
for an accelerator. Besides the runner's outputs, writes ``accuracy.png`` (four panels
against rounds: train and test accuracy, minority-class test accuracy, train objective;
mean +- std over seeds).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedco
from fedco import extend
from fedco.data import imbalanced, partition, sources
from fedco.experiment import outputs, runner
from fedco.models import CNN4, LogisticRegression, ResNet20, accuracy, cross_entropy
from fedco.models.layers import CONV_IMPLS

LOCAL = ("feddro", "ds_feddro")  # the algorithms of the local_steps ablation
ABLATION_DEFAULT = (1, 2, 4, 8, 16, 32)
MODELS = ("resnet20", "cnn4", "linear")
TABLE_KEYS = ("test_acc", "train_acc", "test_minority_acc", "train_objective")
PROGRESS = "test_acc"
SEEDS_IN_ONE_PROGRAM = True  # its seeds differ only in data, model and metrics_data
_EVAL_CHUNK = 256


def check(config) -> None:
  """E5's own fields and methods (``ValueError`` naming ``--config.<field>``)."""
  extend.one_of("--config.dataset", config.dataset, imbalanced.ST_DATASETS)
  extend.one_of("--config.model", config.model, MODELS)
  extend.one_of("--config.conv_impl", config.conv_impl, CONV_IMPLS)
  for name in ("width", "num_clients", "lr_drop_round"):
    extend.positive_int(f"--config.{name}", config[name])
  extend.positive_int("--config.eval_examples", config.eval_examples, minimum=0)
  extend.positive("--config.lam", config.lam)
  extend.bounded("--config.shift", config.shift)
  extend.bounded("--config.keep_fraction", config.keep_fraction, 0.0, 1.0, closed_high=True)
  compared = runner.methods(config, extra_keys=())  # their factories check their arguments
  for m in compared:
    where = f"--config.methods.{m.label}"
    if "num_examples" in m.kwargs:
      raise ValueError(
        f"{where}.num_examples is set by the experiment (the training rows); leave it out"
      )
  runner.local_steps_ablation(config, compared, LOCAL, ABLATION_DEFAULT)  # one to ablate


def methods(config, setup=None) -> List[runner.Method]:
  """The config's methods, or its feddro / ds_feddro ones once per ablation value."""
  del setup
  compared = runner.methods(config, extra_keys=())
  return runner.local_steps_ablation(config, compared, LOCAL, ABLATION_DEFAULT)


def load(config):
  """The step-imbalanced train split and the test split; a TFDS data set that is not prepared
  is a one-line ``FileNotFoundError`` naming the offline alternative."""
  try:
    return imbalanced.load_st(
      config.dataset, config.data_dir or None, keep_fraction=config.keep_fraction
    )
  except FileNotFoundError as err:
    lines = str(err).splitlines()
    reason = (lines[0].split(" To prepare")[0].strip() if lines else "").rstrip(".")
    raise FileNotFoundError(
      f"--config.dataset={config.dataset}: {reason or 'the TFDS data set is not prepared'}. "
      f"Prepare it (tfds build {config.dataset} --file_format=array_record; see "
      f"fedco.data.sources) and pass --config.data_dir, or run offline with "
      f"--config.dataset=digits"
    ) from None


def make_model(config, num_classes: int):
  if config.model == "resnet20":
    return ResNet20(num_classes=num_classes, width=config.width, conv_impl=config.conv_impl)
  if config.model == "cnn4":
    return CNN4(num_classes=num_classes, conv_impl=config.conv_impl)
  return LogisticRegression(num_classes)


@dataclasses.dataclass(frozen=True)
class Shared:
  """What every run shares (``setup``'s result).

  Attributes:
    train: the step-imbalanced training split, ``{"x", "y"}`` (images for the conv nets).
    test: the test split, likewise.
    num_classes: the data set's number of classes.
    model: the Flax model (:func:`make_model`).
    loss: the per-example cross-entropy ``loss(params, example)``.
    metrics_fn: ``metrics_fn(params)`` of :func:`metrics_fn_for`.
    examples: the training split as device arrays, split over the clients per seed.
  """

  train: Dict[str, Any]
  test: Dict[str, Any]
  num_classes: int
  model: Any
  loss: Callable
  metrics_fn: Callable
  examples: Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PerSeed:
  """What one seed's runs share (``prepare``'s result).

  Attributes:
    setup: what every run shares (the loss, the metrics, the training split's size).
    data: the seed's equal random split of the training rows over the clients.
    params: the seed's initial model.
  """

  setup: Shared
  data: fedco.FederatedData
  params: Any


def setup(config) -> Shared:
  """The data (loaded once), the model, the loss and the metrics every run shares."""
  train, test = load(config)
  num_classes = sources.num_classes(config.dataset)
  if config.model != "linear":
    train, test = as_images(train), as_images(test)
  model = make_model(config, num_classes)
  return Shared(
    train=train,
    test=test,
    num_classes=num_classes,
    model=model,
    loss=lambda params, e: cross_entropy(model.apply(params, e["x"]), e["y"]),
    metrics_fn=metrics_fn_for(model.apply, train, test, num_classes, config),
    examples={"x": jnp.asarray(train["x"]), "y": jnp.asarray(train["y"])},
  )


def prepare(config, seed, setup) -> PerSeed:
  """The seed's equal random split over the clients and its initial model."""
  examples = setup.examples
  parts = partition.iid(len(examples["y"]), config.num_clients, seed)
  return PerSeed(
    setup=setup,
    data=fedco.FederatedData.from_index_lists(examples, parts),
    # one compiled program (op by op, each layer's initializer would compile on its own)
    params=jax.jit(setup.model.init)(jax.random.PRNGKey(seed), examples["x"][0]),
  )


def schedule(config, method: runner.Method):
  """The method's rate, divided by 10 after ``config.lr_drop_round`` rounds (counted in its
  local steps: 1 for a method without them)."""
  steps = method.local_steps if method.takes_local_steps else 1
  drop = {config.lr_drop_round * steps: 0.1}
  return optax.piecewise_constant_schedule(method.learning_rate, drop)


def build(config, method, seed, prepared) -> runner.Run:
  """One run: the method on the scheduled rate and the KL-DRO problem, or the plain loss for
  a method of plain problems (FastDRO and primal-dual SGD weight the examples themselves)."""
  del seed
  loss, train = prepared.setup.loss, prepared.setup.train
  extra = {"num_examples": len(train["y"])} if method.algorithm == "primal_dual_dro" else {}
  algorithm = method.build(learning_rate=schedule(config, method), **extra)
  if algorithm.problem_kind == "plain":
    problem = fedco.plain(loss)
  else:
    problem = fedco.problems.sample_kl_dro(loss, config.lam, shift=config.shift)
  return runner.Run(
    problem,
    algorithm,
    prepared.data,
    prepared.params,
    metrics_fn=prepared.setup.metrics_fn,
    simulate={"evaluate": False},
  )


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
    splits[name] = tuple(
      jnp.asarray(a.reshape((-1, _EVAL_CHUNK) + a.shape[1:])) for a in (x, y, real)
    )
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
    return {
      f"{name}_{key}": value
      for name, arrays in splits.items()
      for key, value in zip(("acc", "minority_acc", "objective"), per_split(params, *arrays))
    }

  return metrics_fn


def summarize(config, outcome) -> Dict[str, Any]:
  s = outcome.setup
  return {
    "dataset": _name(config),
    "model": config.model,
    "rounds": config.rounds,
    "num_clients": config.num_clients,
    "data": {
      "train_examples": int(len(s.train["y"])),
      "test_examples": int(len(s.test["y"])),
      "num_classes": s.num_classes,
    },
  }


def _name(config) -> str:
  """``cifar10-ST``, or ``cifar10-ST from cifar10_jpeg.tar.gz`` from an image folder."""
  return sources.describe(config.dataset, config.data_dir).replace(
    config.dataset, f"{config.dataset}-ST", 1
  )


def plot(wd, config, outcome):
  """``accuracy.png`` (see :func:`figure`)."""
  wd.save_figure(figure(outcome.records, config, outcome.labels), "accuracy.png")


def figure(records, config, labels):
  """Train and test accuracy, the minority classes' test accuracy and the training objective
  against rounds; the minority panel says why when it is 0 everywhere."""
  panels = (
    ("train_acc", "train accuracy"),
    ("test_acc", "test accuracy"),
    ("test_minority_acc", "test accuracy, minority classes"),
    ("train_objective", "train KL-DRO objective"),
  )
  why = (
    f"the test accuracy on the minority classes (the first half, "
    f"{100 * config.keep_fraction:g}% of their training images kept) is 0 for every method "
    "at every evaluation: no method predicts a minority class at this budget (more rounds, "
    "or a smaller imbalance, are needed)"
  )
  title = f"{_name(config)}, {config.num_clients} clients"
  return outputs.curves(
    records, labels, panels, title=title, notes={"test_minority_acc": why}, ncols=2
  )
