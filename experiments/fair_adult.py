r"""E6: fair classification on Adult with noisy protected groups (paper 004 Sec. 6, SPEC E6).

Logistic regression on UCI Adult (race removed from the features), trained on SPEC 4.6's
objective ``BCE(w) + log P(w)``, whose penalty ``P`` holds one equal-opportunity constraint
per *proxy* race group (``config.proxy_noise`` = 30% of rows moved to a different group). The
training rows are split IID over ``config.num_clients`` clients (8; the paper also uses 32).
The compared methods are ``config.methods`` (label: settings):

* ``feddro``: FedDRO (paper 004, Alg. 2), ``y_bar`` shared every step, models every
  ``local_steps``; ``beta = 0.5``;
* ``ds_feddro``: DS-FedDRO (Alg. 3), ``beta = 0.5``, server rates ``server_lr_x = 1.3``,
  ``server_lr_y = 1.4``;
* ``gcivr``: GCIVR (Haddadpour et al. 2022) in parallel form (SARAH estimates of the inner
  value, its Jacobian and grad h, averaged over clients every step; Adagrad at its own
  ``learning_rate = 0.01``, estimates refreshed every ``refresh_every = 10`` steps);
* ``fedavg``: the unconstrained baseline, parallel SGD on the plain BCE (FedAvg with one
  local step, i.e. mini-batch SGD with ``K b`` rows per step).

Reported at round 1 and every ``config.eval_every`` rounds on the train and test splits
(streamed to ``metrics.jsonl`` / ``metrics.csv`` while runs go, one row per ``method``,
``seed`` and round): accuracy and the max group violation
``max_k [TPR(all) - TPR(true group k) - eps]`` over the TRUE race groups (and on train the
violation over the proxy groups and the objective). ``config.ablation = "local_steps"`` runs
the ``feddro`` / ``ds_feddro`` methods over ``config.ablation_values`` (default
``1, 2, 4, 8``; the paper's ablation), labelled ``<label>_local_steps=<I>``.

Settings (chosen once, not tuned): paper 004 adopts GCIVR's settings for this experiment
(``eps = 0.01``, ``alpha = gamma = 0.1``, 30% proxy noise, GCIVR's Adagrad rate 0.01) and
keeps its own for FedDRO/DS-FedDRO (batch 16 per client, rate from {0.001, 0.01, 0.05, 0.1},
DS-FedDRO server rates 1.3 / 1.4, 3 seeds). Here FedDRO, DS-FedDRO and SGD use
``config.learning_rate = 0.1`` (the grid's largest: a logistic regression on one-hot features
in a 5-minute budget), ``beta = 0.5`` (fedco's default), ``local_steps = 1`` and 1000
rounds. A seed fixes the proxy noise, the client split and the batches.

    python -m experiments.main --config=experiments/configs/fair_adult.py \
        --workdir=runs/e6                                          # about 1.5 min
    python -m experiments.main --config=experiments/configs/fair_adult.py \
        --workdir=runs/e6_32 --config.num_clients=32
    python -m experiments.main --config=experiments/configs/fair_adult.py \
        --workdir=runs/e6_I --config.ablation=local_steps

Writes ``config.json``, ``metrics.jsonl``, ``metrics.csv``, ``summary.json`` (final test/train
accuracy and max violation per method, at the last evaluated round: mean and std over seeds
and per seed; each method's settings) and ``fairness.png``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List

import jax.numpy as jnp
from matplotlib.ticker import MaxNLocator

from experiments import common, runner
from fedco.data import adult
from fedco.problems import fairness as fair

# The algorithms E6 compares: fedavg is the unconstrained baseline (plain BCE); the others
# solve the fairness problem.
ALGORITHMS = ("feddro", "ds_feddro", "gcivr", "fedavg")
UNCONSTRAINED = ("fedavg",)
LOCAL = ("feddro", "ds_feddro")  # the algorithms of the local_steps ablation
ABLATION_DEFAULT = (1, 2, 4, 8)
TABLE_KEYS = ("test_acc", "test_max_violation", "train_acc", "train_max_violation")


def check(config) -> Dict[str, Any]:
  """The checked settings (``ValueError`` naming ``--config.<field>``); runs nothing."""
  settings = runner.check_shared(config)
  if not isinstance(config.data_dir, str):
    raise ValueError(f"--config.data_dir must be a folder path (or empty: "
                     f"{adult.DEFAULT_DATA_DIR}), got {config.data_dir!r}")
  common.check_int("config.num_clients", config.num_clients, 1)
  common.check_int("config.clients_per_round", config.clients_per_round, 0)
  if config.clients_per_round > config.num_clients:
    raise ValueError(f"--config.clients_per_round must be at most --config.num_clients="
                     f"{config.num_clients} (0: all), got {config.clients_per_round}")
  common.check_positive("config.alpha", config.alpha)
  common.check_positive("config.gamma", config.gamma)
  common.check_positive("config.eps", config.eps, allow_zero=True)
  common.check_real("config.proxy_noise", config.proxy_noise, low=0.0, high=1.0,
                    low_open=False)
  methods = runner.methods(config)
  for m in methods:
    if m.algorithm not in ALGORITHMS:
      raise ValueError(f"--config.methods.{m.label}.algorithm must be one of {ALGORITHMS} "
                       f"(E6's methods), got {m.algorithm!r}")
    if "beta" in m.kwargs:
      common.check_real(f"config.methods.{m.label}.beta", m.kwargs["beta"], low=0.0, high=1.0)
    for name in ("server_lr_x", "server_lr_y"):
      if name in m.kwargs:
        common.check_positive(f"config.methods.{m.label}.{name}", m.kwargs[name])
    if "refresh_every" in m.kwargs:
      common.check_int(f"config.methods.{m.label}.refresh_every", m.kwargs["refresh_every"], 1)
  values = runner.ablation(config, {"local_steps": ABLATION_DEFAULT})
  if values and not any(m.algorithm in LOCAL for m in methods):
    raise ValueError("--config.ablation=local_steps needs a feddro or ds_feddro method in "
                     "--config.methods")
  return {**settings, "methods": methods, "ablation_values": values,
          "data_dir": config.data_dir or adult.DEFAULT_DATA_DIR}


def runs(settings) -> List[runner.Method]:
  """The methods run: the config's, or the feddro / ds_feddro ones once per ablation value."""
  if not settings["ablation_values"]:
    return list(settings["methods"])
  return [m.variant(f"{m.label}_local_steps={v}", local_steps=v)
          for m in settings["methods"] if m.algorithm in LOCAL
          for v in settings["ablation_values"]]


def make(method: runner.Method, config):
  """The problem and algorithm of one run."""
  if method.algorithm in UNCONSTRAINED:
    problem = fair.unconstrained()
  else:
    problem = fair.fairness_problem(adult.NUM_GROUPS, config.eps, config.alpha, config.gamma)
  return problem, method.build()


def load(settings, config) -> adult.AdultData:
  """Adult with proxy groups (seed 0's; each seed redraws them); a missing folder is a
  ``FileNotFoundError`` naming ``--config.data_dir``."""
  data_dir = settings["data_dir"]
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(f"--config.data_dir={data_dir!r} is not a directory holding "
                            "adult.data and adult.test")
  return adult.load_adult(data_dir, proxy_noise=config.proxy_noise, seed=0)


def metrics_fn_for(data: adult.AdultData, config):
  """Accuracy and violations (true groups) on train and test; proxy violation and the
  objective on train."""
  splits = {s: {k: jnp.asarray(v) for k, v in getattr(data, s).items()}
            for s in ("train", "test")}
  G, eps = adult.NUM_GROUPS, config.eps

  def metrics_fn(params):
    out = {}
    for split, a in splits.items():
      m = fair.group_metrics(params, a["x"], a["y"], a["group"], G, eps)
      out[f"{split}_acc"] = m["acc"]
      out[f"{split}_max_violation"] = m["max_violation"]
      out[f"{split}_violations"] = m["violations"]
    tr = splits["train"]
    out["train_proxy_max_violation"] = fair.group_metrics(params, tr["x"], tr["y"],
                                                          tr["proxy"], G, eps)["max_violation"]
    out["train_bce"] = jnp.mean(fair.bce(fair.logit(params, tr["x"]), tr["y"]))
    out["train_objective"] = fair.objective(params, tr["x"], tr["y"], tr["proxy"], G, eps,
                                            config.alpha, config.gamma)
    return out

  return metrics_fn


def run(config, workdir, options: runner.Options = runner.Options()) -> Dict[str, Any]:
  """Runs E6 (or its ablation over local steps) and writes the outputs; returns the summary."""
  start = time.perf_counter()
  settings = check(config)
  base = load(settings, config)
  wd = common.Workdir(workdir)
  wd.write_config(config.to_dict())
  common.start_checkpoints(wd, {"resume": options.resume})
  writers = runner.Writers(wd)
  # What shapes a run besides its method and seed (its checkpoint hash).
  shared = {k: v for k, v in config.to_dict().items()
            if k not in ("seeds", "methods", "ablation", "ablation_values", "learning_rate",
                         "local_steps")}
  methods = runs(settings)
  records, finals = [], {}
  for seed in settings["seeds"]:
    data = adult.resample_proxies(base, proxy_noise=config.proxy_noise, seed=seed)
    fed = adult.federated_adult(data, config.num_clients, seed)
    params = fair.init_params(data.num_features)
    metrics_fn = metrics_fn_for(data, config)
    for method in methods:
      problem, algorithm = make(method, config)
      runner.simulate_method(
          method, seed, problem=problem, algorithm=algorithm, data=fed, params=params, wd=wd,
          options=options, writers=writers, settings=shared, finals=finals, records=records,
          progress_metric="test_max_violation", rounds=settings["rounds"],
          batch_size=settings["batch_size"] or None, evaluate=False,
          eval_every=settings["eval_every"], metrics_fn=metrics_fn,
          clients_per_round=config.clients_per_round or None)
  summary = summarize(finals, settings, config, methods, time.perf_counter() - start)
  for x, name, panels in (
      ("epsilon", "privacy.png", (("test_acc", "test accuracy"),
                                  ("test_max_violation", "test max violation"))),
      ("bytes_up", "compression.png", (("train_objective", "training objective"),
                                       ("test_acc", "test accuracy")))):
    entry = runner.tradeoff(wd, methods, finals, x, panels, name)
    if entry is not None:
      summary[f"{x}_tradeoff"] = entry
  fig, legend_ax = plot(records, config, [m.label for m in methods])
  common.save_with_legend(wd, fig, legend_ax, "fairness.png", legend=bool(legend_ax.lines),
                          fontsize=8)
  wd.write_summary(summary)
  if options.progress:
    print(common.format_table(summary["table"]))
    print(f"wall time {summary['seconds']:.1f} s")
  return summary


def summarize(finals, settings, config, methods, seconds) -> Dict[str, Any]:
  per_method, table = common.seed_statistics(finals, TABLE_KEYS)
  summary = {"rounds": settings["rounds"], "num_clients": config.num_clients,
             "seeds": list(settings["seeds"]), "methods": per_method, "table": table,
             "settings": {m.label: m.settings() for m in methods}, "seconds": seconds}
  baselines = [m.label for m in methods if m.algorithm in UNCONSTRAINED]
  if baselines and len(per_method) > len(baselines):
    for split in ("test", "train"):
      key = f"{split}_max_violation"
      means = {label: e[key]["mean"] for label, e in per_method.items()}
      if all(v is not None for v in means.values()):
        summary[f"unconstrained_has_largest_{split}_violation"] = bool(
            min(means[b] for b in baselines) >= max(means.values()))
  return summary


def plot(records, config, labels):
  """Accuracy and max violation on test and train against rounds; returns
  ``(figure, legend axes)``. One line per method (mean over seeds, +- std band), each with
  its own line style and marker."""
  fig = common.figure(figsize=(11, 8))
  axes = fig.subplots(2, 2)
  drawn = [label for label in labels if any(r["method"] == label for r in records)]
  panels = (("test_acc", "test accuracy"), ("test_max_violation", "test max violation"),
            ("train_acc", "train accuracy"), ("train_max_violation", "train max violation"))
  for ax, (key, title) in zip(axes.ravel(), panels):
    ax.set_xlabel("round")
    ax.set_ylabel(title)
    ax.set_title(f"Adult, {config.num_clients} clients: {title}", fontsize=10)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not drawn:
      ax.text(0.5, 0.5, f"{title}: no finite evaluation (every run diverged at once)",
              transform=ax.transAxes, ha="center", va="center", fontsize=8)
      continue
    for i, label in enumerate(drawn):
      common.plot_mean_curves(ax, records, key, labels=[label], band=0.15, group="method",
                              skip_missing=True)
      common.distinguish(ax.lines[-1], i)  # FedDRO and MBSGD can coincide: both stay visible
    if "violation" in key:
      ax.axhline(0.0, color="k", lw=0.8, ls=":")
    ax.grid(alpha=0.3)
  legend_ax = next((ax for ax in axes.ravel() if ax.lines), axes[0, 0])
  return fig, legend_ax
