r"""DRO-FL on UCI Adult: doctorate against non-doctorate clients (the agnostic-FL setting).

Two clients split the real Adult training rows by education: 413 doctorate rows and 32,148
others; each is scored on its own rows of the standard test split (181 and 16,100). Features
are the shared preprocessing of :func:`fedco.data.load_adult` (categorical columns one-hot,
continuous ones bucketised and one-hot, race held out); the model is logistic regression.
The compared methods and their settings are ``config.methods`` (each a ``fedco.ALGORITHMS``
name, the problem form it solves and its arguments); every method gets the budget's learning
rate, local steps and batch size. The agnostic-FL and q-FFL papers report that DRO methods
raise the doctorate client's test accuracy above (sample-weighted) FedAvg's.

Run through the config driver::

    python -m experiments.main --config=experiments/configs/adult_dro.py --workdir=runs/adult

Writes (streamed while runs go) ``metrics.jsonl`` / ``metrics.csv`` with one row per
evaluation (``method``, ``seed``, per-client training loss and test accuracy), then
``summary.json``, ``adult_dro.png`` and a table: per method, mean +- std over seeds of the
doctorate, non-doctorate and worst test accuracy and the worst training loss.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

import fedco
from experiments import common, runner
from fedco import metrics as metrics_lib

PROBLEMS = ("erm", "kl_exp", "kl_log")
BUDGETS = ("short", "converged")
CLIENTS = ("doctorate", "other")


def _loss(params, example):
  logit = example["x"] @ params["w"] + params["b"]
  return jnp.logaddexp(0.0, logit) - example["y"] * logit  # logistic loss, y in {0, 1}


def _stats(params, example):
  logit = example["x"] @ params["w"] + params["b"]
  hit = jnp.where(logit > 0, 1.0, 0.0) == example["y"]
  return _loss(params, example), hit.astype(jnp.float32)


def check(config) -> Dict[str, Any]:
  """The checked settings (``ValueError`` naming ``--config.<field>``)."""
  settings = runner.check_shared(config)
  if config.budget not in BUDGETS:
    raise ValueError(f"--config.budget must be one of {BUDGETS}, got {config.budget!r}")
  common.check_positive("config.gamma", config.gamma)
  common.check_positive("config.converge_tol", config.converge_tol)
  methods = runner.methods(config, extra_keys=("problem",))
  for label, entry in config.methods.items():
    if entry.get("problem") not in PROBLEMS:
      raise ValueError(f"--config.methods.{label}.problem must be one of {PROBLEMS}, got "
                       f"{entry.get('problem')!r}")
  return {**settings, "methods": methods}


def load(config):
  """Training clients (doctorate, other) and each client's test rows."""
  data_dir = config.data_dir or fedco.data.adult.DEFAULT_DATA_DIR
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(f"--config.data_dir={data_dir!r} is not a directory holding "
                            "adult.data and adult.test")
  adult = fedco.data.load_adult(data_dir)
  column = adult.feature_names.index("education=Doctorate")
  split = lambda d: (np.flatnonzero(d["x"][:, column] == 1),
                     np.flatnonzero(d["x"][:, column] != 1))
  examples = {"x": adult.train["x"], "y": adult.train["y"].astype(np.float32)}
  fed = fedco.FederatedData.from_index_lists(examples, list(split(adult.train))).with_owner()
  tests = [{"x": jnp.asarray(adult.test["x"][rows]), "y": jnp.asarray(adult.test["y"][rows])}
           for rows in split(adult.test)]
  return fed, tests


def make(method: runner.Method, config):
  """``(problem, algorithm)`` of one method."""
  form = config.methods[method.label].problem
  extra = {"gamma": config.gamma} if method.kwargs.get("normalized") else {}
  if form == "erm":
    problem = fedco.plain(_loss, name="logistic")
  elif form == "kl_exp":
    problem = fedco.problems.client_kl_dro(_loss, config.gamma)
  else:
    problem = fedco.problems.client_kl_dro_log(_loss, config.gamma, len(CLIENTS))
  return problem, method.build(**extra)


def run(config, workdir, options: runner.Options = runner.Options()) -> Dict[str, Any]:
  """Runs every method for every seed and writes the outputs; returns the summary."""
  settings = check(config)
  fed, tests = load(config)
  wd = common.Workdir(workdir)
  wd.write_config(config.to_dict())
  common.start_checkpoints(wd, {"resume": options.resume})
  writers = runner.Writers(wd)
  dim = fed.examples["x"].shape[1]

  def metrics_fn(p):
    losses, _ = metrics_lib.per_client_mean(_stats, p, fed)
    out = {"train_loss_worst": jnp.max(losses),
           "train_loss_avg": jnp.sum(losses * fed.counts) / jnp.sum(fed.counts)}
    for name, test, loss in zip(CLIENTS, tests, losses):
      out[f"train_loss_{name}"] = loss
      out[f"test_acc_{name}"] = jnp.mean(jax.vmap(_stats, (None, 0))(p, test)[1])
    out["test_acc_worst"] = jnp.minimum(out["test_acc_doctorate"], out["test_acc_other"])
    return out

  finals, curves = {}, []
  for seed in settings["seeds"]:
    for method in settings["methods"]:
      problem, algorithm = make(method, config)
      # the same local steps per client for methods without local steps (AFL)
      scale = 1 if algorithm.plan.local_steps > 1 else method.local_steps
      result = runner.simulate_method(
          method, seed, problem=problem, algorithm=algorithm, data=fed,
          params={"w": jnp.zeros((dim,)), "b": jnp.zeros(())}, wd=wd, options=options,
          writers=writers, settings={"budget": config.budget, "gamma": config.gamma,
                                     "batch_size": settings["batch_size"],
                                     "rounds": settings["rounds"] * scale,
                                     "problem": config.methods[method.label].problem},
          finals=finals, records=curves, progress_metric="test_acc_doctorate",
          record_keys=("test_acc_doctorate",), rounds=settings["rounds"] * scale,
          batch_size=settings["batch_size"] or None, evaluate=False,
          eval_every=settings["eval_every"] * scale, metrics_fn=metrics_fn)
      if result is None:
        continue
      m = result.metrics
      evaluated = np.flatnonzero(m["evaluated"])
      final = finals[method.label][seed]
      if config.budget == "converged" and evaluated.size > 1:
        change = abs(float(m["train_loss_worst"][evaluated[-1]] -
                           m["train_loss_worst"][evaluated[-2]]))
        final["last_change_train_loss_worst"] = change
        final["converged"] = change < config.converge_tol
  keys = ("test_acc_doctorate", "test_acc_other", "test_acc_worst", "train_loss_worst")
  per_method, table = common.seed_statistics(finals, keys)
  fedavg = per_method.get("fedavg", {}).get("test_acc_doctorate", {}).get("mean")
  above = {label: entry["test_acc_doctorate"]["mean"] > fedavg
           for label, entry in per_method.items()
           if label != "fedavg" and fedavg is not None
           and entry["test_acc_doctorate"]["mean"] is not None}
  summary = {"budget": config.budget,
             "settings": {k: v for k, v in settings.items() if k != "methods"},
             "gamma": config.gamma,
             "clients": {"train": np.asarray(fed.counts).tolist(),
                         "test": [int(t["y"].shape[0]) for t in tests]},
             "methods": per_method, "doctorate_test_acc_above_fedavg": above,
             "table": table}
  if config.budget == "converged":
    summary["converged"] = {label: all(f.get("converged", False) for f in by_seed.values())
                            for label, by_seed in finals.items()}
  _plot(wd, curves, config)
  tradeoff = runner.tradeoff(wd, settings["methods"], finals, "epsilon",
                             (("test_acc_doctorate", "doctorate client's test accuracy"),
                              ("test_acc_worst", "worst client's test accuracy")),
                             "privacy.png")
  if tradeoff is not None:
    summary["epsilon_tradeoff"] = tradeoff
  wd.write_summary(summary)
  if options.progress:
    print(common.format_table(table))
  return summary


def _plot(wd, curves: List[Dict[str, Any]], config):
  fig = common.figure(figsize=(6, 4))
  ax = fig.subplots()
  drawn = common.plot_mean_curves(ax, curves, "test_acc_doctorate", band=0.15,
                                  group="method")
  ax.set_xlabel("round")
  ax.set_ylabel("doctorate client's test accuracy")
  ax.set_title(f"UCI Adult, doctorate vs other ({config.budget} budget)")
  ax.grid(alpha=0.3)
  common.save_with_legend(wd, fig, ax, "adult_dro.png", legend=bool(drawn), fontsize=8)
