r"""DRO-FL on UCI Adult: doctorate against non-doctorate clients (the agnostic-FL setting).

Two clients split the real Adult training rows by education: 413 doctorate rows and 32,148
others; each is scored on its own rows of the standard test split (181 and 16,100). Features
are the shared preprocessing of :func:`fedco.data.load_adult` (categorical columns one-hot,
continuous ones bucketised and one-hot, race held out); the model is logistic regression.
The compared methods and their settings are ``config.methods`` (each a ``fedco.ALGORITHMS``
name, the problem form it solves (unset: the one of its kind) and its arguments); every
method gets the budget's learning rate, local steps and batch size. The agnostic-FL and
q-FFL papers report that DRO methods raise the doctorate client's test accuracy above
(sample-weighted) FedAvg's.

Run through the config driver (``adult_dro_converged.py`` and ``adult_dro_privacy.py`` are
its variants)::

    python -m experiments.main --config=experiments/configs/adult_dro.py --workdir=runs/adult

Writes (streamed while runs go) ``metrics.jsonl`` / ``metrics.csv`` with one row per
evaluation (``method``, ``seed``, per-client training loss and test accuracy), then
``summary.json``, ``adult_dro.png`` and a table: per method, mean +- std over seeds of the
doctorate, non-doctorate and worst test accuracy and the worst training loss.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

import fedco
from fedco import extend
from fedco import metrics as metrics_lib
from fedco.experiment import outputs, runner

PROBLEMS = ("erm", "kl_exp", "kl_log")
BUDGETS = ("short", "converged")
CLIENTS = ("doctorate", "other")
TABLE_KEYS = ("test_acc_doctorate", "test_acc_other", "test_acc_worst", "train_loss_worst")
PROGRESS = "test_acc_doctorate"
SEEDS_IN_ONE_PROGRAM = True  # its seeds differ only in data, model and metrics_data
TRADEOFF = {
  "epsilon": (
    ("test_acc_doctorate", "doctorate client's test accuracy"),
    ("test_acc_worst", "worst client's test accuracy"),
  )
}


def _loss(params, example):
  logit = example["x"] @ params["w"] + params["b"]
  return jnp.logaddexp(0.0, logit) - example["y"] * logit  # logistic loss, y in {0, 1}


def _stats(params, example):
  hit = jnp.where(example["x"] @ params["w"] + params["b"] > 0, 1.0, 0.0) == example["y"]
  return _loss(params, example), hit.astype(jnp.float32)


def check(config) -> None:
  """The experiment's own fields (``ValueError`` naming ``--config.<field>``)."""
  extend.one_of("--config.budget", config.budget, BUDGETS)
  extend.positive("--config.gamma", config.gamma)
  extend.positive("--config.converge_tol", config.converge_tol)
  check_problems(config)


# A method that names no problem form solves the one of its kind (decision 92).
FORMS = {"plain": "erm", "local": "kl_exp", "global": "kl_log"}


def check_problems(config) -> None:
  """Every method's problem form, where it names one (``ValueError`` naming the field)."""
  for label, entry in config.methods.items():
    if entry.get("problem") not in (None, *PROBLEMS):
      raise ValueError(
        f"--config.methods.{label}.problem must be one of {PROBLEMS} (or unset: the form of "
        f"its algorithm's kind), got {entry.get('problem')!r}"
      )


def problem_and_algorithm(config, method, loss, num_clients: int, name: str):
  """``(problem, algorithm, scale)``: the method's problem form (``method.problem["problem"]``:
  the plain loss named ``name``, or client-level KL-DRO at ``config.gamma`` in its exp or log
  form; unset: the form of the algorithm's kind, :data:`FORMS`), its algorithm (normalised
  ComFedL also gets ``gamma``) and how many rounds of one step stand for one round
  (``method.local_steps`` for methods without local steps, AFL)."""
  algorithm = method.build(**({"gamma": config.gamma} if method.kwargs.get("normalized") else {}))
  form = method.problem.get("problem") or FORMS[algorithm.problem_kind]
  if form == "erm":
    problem = fedco.plain(loss, name=name)
  elif form == "kl_exp":
    problem = fedco.problems.client_kl_dro(loss, config.gamma)
  else:
    problem = fedco.problems.client_kl_dro_log(loss, config.gamma, num_clients)
  scale = 1 if algorithm.plan.local_steps > 1 else method.local_steps
  return problem, algorithm, scale


@dataclasses.dataclass(frozen=True)
class Shared:
  """What every run shares (``setup``'s result; every seed runs on the same clients).

  Attributes:
    fed: the two training clients (doctorate, other), each example with its owner.
    tests: each client's test rows, ``{"x", "y"}`` in the order of :data:`CLIENTS`.
    metrics_fn: ``metrics_fn(params)``: per-client training loss and test accuracy, and
      the worst and average of them.
  """

  fed: fedco.FederatedData
  tests: List[Dict[str, Any]]
  metrics_fn: Callable


def setup(config) -> Shared:
  """Training clients (doctorate, other), each client's test rows and the metrics."""
  data_dir = config.data_dir or fedco.data.adult.DEFAULT_DATA_DIR
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(
      f"--config.data_dir={data_dir!r} is not a directory holding adult.data and adult.test"
    )
  adult = fedco.data.load_adult(data_dir)
  column = adult.feature_names.index("education=Doctorate")
  split = lambda d: (np.flatnonzero(d["x"][:, column] == 1), np.flatnonzero(d["x"][:, column] != 1))
  examples = {"x": adult.train["x"], "y": adult.train["y"].astype(np.float32)}
  fed = fedco.FederatedData.from_index_lists(examples, list(split(adult.train))).with_owner()
  tests = [
    {"x": jnp.asarray(adult.test["x"][rows]), "y": jnp.asarray(adult.test["y"][rows])}
    for rows in split(adult.test)
  ]

  def metrics_fn(p):
    losses, _ = metrics_lib.per_client_mean(_stats, p, fed)
    out = {
      "train_loss_worst": jnp.max(losses),
      "train_loss_avg": jnp.sum(losses * fed.counts) / jnp.sum(fed.counts),
    }
    for name, test, loss in zip(CLIENTS, tests, losses):
      out[f"train_loss_{name}"] = loss
      out[f"test_acc_{name}"] = jnp.mean(jax.vmap(_stats, (None, 0))(p, test)[1])
    out["test_acc_worst"] = jnp.minimum(out["test_acc_doctorate"], out["test_acc_other"])
    return out

  return Shared(fed, tests, metrics_fn)


def build(config, method, seed, prepared) -> runner.Run:
  """One method's problem form (``method.problem["problem"]``) and algorithm; methods
  without local steps (AFL) run ``rounds * local_steps`` rounds of one step."""
  del seed
  fed = prepared.fed
  problem, algorithm, scale = problem_and_algorithm(config, method, _loss, len(CLIENTS), "logistic")
  dim = fed.examples["x"].shape[1]
  return runner.Run(
    problem,
    algorithm,
    fed,
    {"w": jnp.zeros((dim,)), "b": jnp.zeros(())},
    metrics_fn=prepared.metrics_fn,
    rounds=config.rounds * scale,
    eval_every=config.eval_every * scale,
    simulate={"evaluate": False},
    record_keys=("test_acc_doctorate",),
  )


def finish(config, method, seed, result, final) -> None:
  """The converged budget: the worst training loss's change over the last two evaluations,
  and whether it is below ``config.converge_tol``."""
  del method, seed
  loss = result.metrics["train_loss_worst"][result.metrics["evaluated"]]
  if config.budget == "converged" and loss.size > 1:
    final["last_change_train_loss_worst"] = change = abs(float(loss[-1] - loss[-2]))
    final["converged"] = change < config.converge_tol


def summarize(config, outcome) -> Dict[str, Any]:
  fed, tests = outcome.setup.fed, outcome.setup.tests
  acc = {label: e["test_acc_doctorate"]["mean"] for label, e in outcome.per_method.items()}
  fedavg = acc.get("fedavg")
  summary = {
    "budget": config.budget,
    "gamma": config.gamma,
    "clients": {
      "train": np.asarray(fed.counts).tolist(),
      "test": [int(t["y"].shape[0]) for t in tests],
    },
    "doctorate_test_acc_above_fedavg": {
      label: a > fedavg for label, a in acc.items() if label != "fedavg" and None not in (fedavg, a)
    },
  }
  if config.budget == "converged":
    summary["converged"] = {
      label: all(f.get("converged", False) for f in by_seed.values())
      for label, by_seed in outcome.finals.items()
    }
  return summary


def plot(wd, config, outcome):
  """``adult_dro.png``: the doctorate client's test accuracy against rounds."""
  panels = (("test_acc_doctorate", "doctorate client's test accuracy"),)
  title = f"UCI Adult, doctorate vs other ({config.budget} budget)"
  fig = outputs.curves(outcome.records, outcome.labels, panels, title=title, finals=outcome.finals)
  wd.save_figure(fig, "adult_dro.png")
