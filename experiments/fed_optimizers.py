r"""Federated optimizers on real clients: Reddi et al. 2021's Shakespeare and EMNIST settings.

"Adaptive Federated Optimization" (Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar,
McMahan, ICLR 2021) compares server optimizers on FedAvg's clients: FedAvg (server SGD),
FedAvgM (server SGD with momentum 0.9), FedAdagrad, FedAdam and FedYogi, with SCAFFOLD
beside them. Here each runs at their published rates (the configs cite where each number
comes from) on TFF's Shakespeare, one client per speaking role, next-character LSTM
(``dataset = "shakespeare"``), or on FEMNIST's writers from LEAF's files with their EMNIST
CNN (``"emnist"``; ``fed_optimizers_emnist.py``). Every round samples
``clients_per_round`` clients; each takes ``local_epochs`` passes over its rows in batches
of ``batch_size`` (``ceil(n_k / B)`` steps an epoch, so Shakespeare's clients take from 1 to
about 250 steps; ``local_epochs = 0``: ``local_steps`` steps of batches drawn with
replacement instead) and the server combines the clients' models weighted by their
examples (SCAFFOLD: uniformly, as fedco's SCAFFOLD does).

FedAvg and FedAvgM are ``fedco.fedavg`` with an ``optax.sgd`` server
(``fedco.algorithms.adaptive.with_server``) from a method's ``server_sgd`` entry
(``learning_rate``, ``momentum``) in its ``problem`` (the experiment's own settings of a
method, with ``paper``, the published accuracy); rate 1 without momentum is plain averaging.

**Metrics**, every ``eval_every`` rounds on the server model: ``test_accuracy`` and
``test_loss`` over the whole held-out split pooled as TFF evaluates it
(:func:`fedco.metrics.pooled_mean`): Shakespeare's accuracy over every held-out target that
is a character (pad, OOV, BOS and EOS left out) and its loss over every non-pad target;
EMNIST's over every held-out image. A large client weighs by its size, unlike the
per-client means of E8. The table holds their final values over seeds; the report lines
give each method's mean with its standard error beside the paper's published accuracy
(``problem.paper`` in each method's entry; "not found" where the config has none), and the seconds
a round took.

    python -m experiments.main --config=experiments/configs/fed_optimizers.py --workdir=runs/fedopt
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedco
from fedco import extend, models
from fedco import metrics as metrics_lib
from fedco.algorithms import adaptive
from fedco.data import tff
from fedco.experiment import outputs, runner

DATASETS = ("shakespeare", "emnist")
_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared")
DEFAULT_DIRS = {
  "shakespeare": os.path.join(_DATA, "data", "shakespeare_tff"),
  "emnist": os.path.join(_DATA, "data", "femnist_leaf_sf005"),
}
WHAT = {
  "shakespeare": "TFF's Shakespeare: shakespeare_train.h5 and shakespeare_test.h5",
  "emnist": "LEAF's FEMNIST: train/ and test/ of JSON files",
}
# A method's ``problem`` settings (the experiment's own): the server SGD of FedAvg /
# FedAvgM, the published accuracy.
PROBLEM_KEYS = ("server_sgd", "paper")
KEYS = ("test_accuracy", "test_loss")
TABLE_KEYS = KEYS
PROGRESS = "test_accuracy"


def check(config) -> None:
  """The experiment's own fields (one-line ``ValueError`` naming ``--config.<field>``)."""
  extend.one_of("--config.dataset", config.dataset, DATASETS)
  extend.positive_int("--config.clients_per_round", config.clients_per_round)
  for field in ("local_epochs", "client_chunk", "eval_batch", "max_clients", "hidden_size"):
    extend.positive_int(f"--config.{field}", config[field], minimum=0)
  if config.local_epochs:
    if not config.batch_size:
      raise ValueError(
        f"--config.local_epochs={config.local_epochs} needs a --config.batch_size >= 1 (an "
        "epoch is ceil(n_k / batch_size) steps)"
      )
  if config.client_chunk and not config.local_epochs:
    raise ValueError(
      f"--config.client_chunk={config.client_chunk} applies under --config.local_epochs >= 1 "
      "(clients with their own step counts); set it to 0 with --config.local_epochs=0"
    )
  if config.max_clients and config.dataset != "shakespeare":
    raise ValueError(
      f"--config.max_clients={config.max_clients} applies to shakespeare; {config.dataset} "
      "keeps every client (0)"
    )
  if config.hidden_size and config.dataset != "shakespeare":
    raise ValueError(
      f"--config.hidden_size={config.hidden_size} is the Shakespeare LSTM's; the EMNIST CNN "
      "has no such field (0)"
    )


def methods(config, setup) -> List[runner.Method]:
  """The config's methods; each ``problem``'s ``server_sgd`` (FedAvg's / FedAvgM's server)
  checked, its ``paper`` (the published accuracy) kept out of the runs' identities (a
  corrected number must not start the runs afresh)."""
  del setup
  out = []
  for method in runner.methods(config):
    where = f"--config.methods.{method.label}.problem"
    if not isinstance(method.problem.get("problem", {}), dict):
      raise ValueError(f"{where} must be {{server_sgd, paper}}, got {method.problem['problem']!r}")
    settings = dict(method.problem.get("problem", {}))
    unknown = sorted(set(settings) - set(PROBLEM_KEYS))
    if unknown:
      raise ValueError(
        f"{where}.{unknown[0]} is not a setting of fed_optimizers; allowed: {list(PROBLEM_KEYS)}"
      )
    server = settings.get("server_sgd")
    if server is not None:
      if method.algorithm != "fedavg":
        raise ValueError(
          f"{where}.server_sgd is FedAvg's server (fedco.fedavg); fedco.{method.algorithm} "
          "has its own server settings (server_lr, ...)"
        )
      if not isinstance(server, dict) or set(server) != {"learning_rate", "momentum"}:
        raise ValueError(f"{where}.server_sgd must be {{learning_rate, momentum}}, got {server!r}")
      extend.positive(f"{where}.server_sgd.learning_rate", server["learning_rate"])
      extend.bounded(f"{where}.server_sgd.momentum", server["momentum"], 0, 1, closed_low=True)
    paper = settings.pop("paper", None)
    if paper is not None:
      extend.bounded(f"{where}.paper", paper, 0, 100, closed_low=True, closed_high=True)
    out.append(dataclasses.replace(method, problem=settings))
  return out


def setup(config):
  """The clients, read once (a missing folder: one line saying what to pass)."""
  folder = config.data_dir or DEFAULT_DIRS[config.dataset]
  if not os.path.isdir(folder):
    raise FileNotFoundError(
      f"--config.data_dir={folder!r} is not a folder; pass one holding {WHAT[config.dataset]} "
      f"(default: {os.path.normpath(DEFAULT_DIRS[config.dataset])})"
    )
  if config.dataset == "shakespeare":
    fed = fedco.data.load_shakespeare_tff(folder, max_clients=config.max_clients or None)
  else:
    fed = fedco.data.load_leaf(folder, "femnist")
  if config.clients_per_round > fed.num_clients:
    raise ValueError(
      f"--config.clients_per_round={config.clients_per_round} exceeds the "
      f"{fed.num_clients} clients of {folder}"
    )
  return fed


def model_of(config):
  """The dataset's model: the Shakespeare LSTM (``hidden_size`` units, 0: 256) or the
  EMNIST CNN (dropout off, decision 100)."""
  if config.dataset == "shakespeare":
    return models.ShakespeareLSTM(hidden_size=config.hidden_size or 256)
  return models.EmnistCNN()


def losses(config, model):
  """``(loss(params, example), pooled(params, example))``: the training loss of one example
  and its ``{name: (value, weight)}`` for :func:`fedco.metrics.pooled_mean`."""
  if config.dataset == "shakespeare":

    def loss(params, e):
      return tff.shakespeare_loss(model.apply(params, e["x"]), e["y"])

    def pooled(params, e):
      logits = model.apply(params, e["x"])
      scored = tff.shakespeare_scored(e["y"])
      return {
        "test_accuracy": (tff.shakespeare_accuracy(logits, e["y"]), scored.sum()),
        "test_loss": (tff.shakespeare_loss(logits, e["y"]), (e["y"] != tff.PAD).sum()),
      }

  else:

    def loss(params, e):
      return models.cross_entropy(model.apply(params, e["x"]), e["y"])

    def pooled(params, e):
      logits = model.apply(params, e["x"])
      return {
        "test_accuracy": (models.accuracy(logits, e["y"]), 1),
        "test_loss": (models.cross_entropy(logits, e["y"]), 1),
      }

  return loss, pooled


@dataclasses.dataclass(frozen=True)
class PerSeed:
  """What one seed's runs share (``prepare``'s result).

  Attributes:
    fed: the clients and the held-out split (``setup``'s, the same for every seed).
    model: the dataset's model (:func:`model_of`).
    params: the seed's initial model.
    test: the whole held-out split as device arrays (the metrics' data).
  """

  fed: fedco.data.FederatedDataset
  model: Any
  params: Any
  test: Dict[str, Any]


def prepare(config, seed, setup) -> PerSeed:
  """One seed's initial model; the clients and the held-out split are the setup's."""
  model = model_of(config)
  params = models.init_params(model, setup.train.examples["x"][0], seed)
  test = jax.tree.map(jnp.asarray, dict(setup.test))
  return PerSeed(fed=setup, model=model, params=params, test=test)


def make_metrics_fn(config, pooled):
  """``test_accuracy`` and ``test_loss`` over the whole held-out split, pooled."""

  def metrics_fn(params, test):
    return metrics_lib.pooled_mean(pooled, params, test, batch_size=config.eval_batch)

  return metrics_fn


def local_steps(config, method, fed) -> int:
  """A method's steps a round: the cap every client's epochs need under ``local_epochs``
  (``fedco.runtime.epoch_steps``), else the method's ``local_steps``."""
  if config.local_epochs:
    return fedco.runtime.epoch_steps(fed.train, config.batch_size, config.local_epochs)
  return method.local_steps


def algorithm_of(config, method, fed):
  """The method's algorithm at its steps; FedAvg's server replaced by ``server_sgd``."""
  algorithm = method.build(local_steps=local_steps(config, method, fed))
  server = method.problem.get("server_sgd")
  if server is not None:
    momentum = float(server["momentum"]) or None
    tx = optax.sgd(float(server["learning_rate"]), momentum=momentum)
    algorithm = adaptive.with_server(algorithm, tx)
  return algorithm


def build(config, method, seed, prepared) -> runner.Run:
  """One method's run: the plain problem of the dataset's loss, its algorithm, the pooled
  held-out metrics (no exact objective over the training clients: ``evaluate=False``)."""
  del seed
  fed = prepared.fed
  loss, pooled = losses(config, prepared.model)
  simulate: Dict[str, Any] = {"evaluate": False, "clients_per_round": config.clients_per_round}
  if config.local_epochs:
    simulate["local_epochs"] = config.local_epochs
    if config.client_chunk:
      simulate["client_chunk"] = config.client_chunk
  return runner.Run(
    fedco.plain(loss),
    algorithm_of(config, method, fed),
    fed.train,
    prepared.params,
    metrics_fn=make_metrics_fn(config, pooled),
    metrics_data=prepared.test,
    simulate=simulate,
    record_keys=KEYS,
  )


def paper_accuracy(config, label: str):
  """The published accuracy (%) of ``config.methods[label]``, ``None`` when unset."""
  entry = config.methods.get(label)
  problem = None if entry is None else entry.get("problem")
  return None if problem is None else problem.get("paper")


def summarize(config, outcome) -> Dict[str, Any]:
  """Per method: the final pooled accuracy's mean and standard error over the seeds that
  finished, the paper's number, the local steps a round and the seconds a round took."""
  fed = outcome.setup
  out: Dict[str, Any] = {
    "dataset": config.dataset,
    "clients": fed.num_clients,
    "test_examples": int(len(fed.test["y"])),
    "local_epochs": config.local_epochs,
  }
  compared = {}
  for m in outcome.methods:
    done = [f for f in outcome.finals.get(m.label, {}).values() if "diverged" not in f]
    acc = np.array([f["test_accuracy"] for f in done])
    compared[m.label] = {
      "test_accuracy": float(acc.mean()) if acc.size else None,
      "stderr": outputs.standard_error(acc),
      "seeds": int(acc.size),
      "paper": paper_accuracy(config, m.label),
      "local_steps": local_steps(config, m, fed),
      "seconds_per_round": (
        float(np.mean([f["seconds"] for f in done])) / config.rounds if done else None
      ),
    }
  out["against_paper"] = compared
  return out


def report(summary) -> List[str]:
  """One line per method: our pooled held-out accuracy (%) +- its standard error over
  seeds, and the paper's."""
  lines = []
  for label, c in summary["against_paper"].items():
    if c["test_accuracy"] is None:
      ours = "diverged on every seed"
    else:
      err = f" +- {100 * c['stderr']:.2f}" if c["stderr"] is not None else ""
      seeds = f"{c['seeds']} seed{'s' if c['seeds'] != 1 else ''}"
      ours = f"{100 * c['test_accuracy']:.2f}{err} ({seeds})"
    paper = "not found" if c["paper"] is None else f"{c['paper']:.1f}"
    time = "" if c["seconds_per_round"] is None else f", {c['seconds_per_round']:.2f} s a round"
    lines.append(f"{label}: held-out accuracy {ours}; paper {paper}{time}")
  return lines


def plot(wd, config, outcome):
  """Pooled held-out accuracy and loss against rounds."""
  panels = (("test_accuracy", "held-out accuracy (pooled)"), ("test_loss", "held-out loss"))
  fig = outputs.curves(
    outcome.records, outcome.labels, panels, title=config.dataset, finals=outcome.finals
  )
  wd.save_figure(fig, "fed_optimizers.png")
