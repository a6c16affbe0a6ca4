r"""E1: distributionally robust federated learning (papers 000/001, Sec. 5.1).

Multinomial logistic regression over 10 clients whose data sizes are very unequal: one
random client holds ``--big`` training images, every other one ``--small`` (MNIST: 5000 and
20). Each client's validation set is drawn from the test split with the same size ratio and
class mix as its training set, at least 10 images (SPEC E1 Choice). Four algorithms run side
by side with the paper's settings (``tau = 5``, ``lr = 0.01`` for all):

* ComFedL on client-level KL-DRO, exp form ``1/K sum_k exp(f_k / gamma)``, ``gamma = 0.2``,
  as printed (``comfedl``: its step ``exp(f/gamma)/gamma grad f`` is about 5e5 x the
  gradient here and diverges at round 1, reported as such) and with normalised client
  weights (``comfedl_normalized``: ``exp(f/gamma - L) grad f``, the log form's
  ``n softmax(f/gamma)`` weights; see ``fedco.comfedl``);
* DRFL (DRFA) with client-weight rate ``gamma_lambda = 0.08``;
* q-FedAvg with ``q = 0.2``;
* FedAvg with sample-weighted averaging.

Reported per evaluation: average and worst client accuracy and loss on train and validation
(and, for ComFedL, the implied client weights ``r = softmax(f / gamma)`` of the training
losses). ``--sweep=tau`` or ``--sweep=gamma`` runs the paper's ComFedL ablations instead.

    python -m experiments.dro_fl --workdir=runs/e1                    # offline: digits
    python -m experiments.dro_fl --workdir=runs/e1 --dataset=mnist    # TFDS, prepared

``--dataset=digits`` (scikit-learn's bundled 8x8 digits, 1347 training images) is the
offline default, scaled to its size: one client with 1000 training images, nine with 20.
Writes ``config.json``, ``metrics.jsonl``, ``summary.json`` and ``accuracy.png`` (the paper's
two panels: average and worst validation accuracy against rounds).
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List

from absl import app
from absl import flags
import numpy as np

import fedco
from experiments import common
from fedco import metrics as metrics_lib
from fedco import models
from fedco.data import partition
from fedco.data.datasets import make_federated
from fedco.problems import kl_dro_weights

ALGORITHMS = ("comfedl", "comfedl_normalized", "drfl", "qfedavg", "fedavg")
LABELS = {"comfedl": "ComFedL", "comfedl_normalized": "ComFedL (normalised)", "drfl": "DRFL",
          "qfedavg": "q-FedAvg", "fedavg": "FedAvg"}
COMFEDL = ("comfedl", "comfedl_normalized")
DATASETS = ("digits", "mnist", "fashion_mnist")
# (big client, small clients) training sizes: the paper's for MNIST, scaled for digits.
SIZES = {"digits": (1000, 20), "mnist": (5000, 20), "fashion_mnist": (5000, 20)}
SWEEPS = ("none", "tau", "gamma")
SWEEP_DEFAULTS = {"tau": (1, 2, 5, 10), "gamma": (0.1, 0.2, 2.0, 5.0)}

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "Output directory (created if missing).")
  flags.DEFINE_enum("dataset", "digits", list(DATASETS), "Dataset; digits needs no download.")
  flags.DEFINE_string("data_dir", None, "TFDS data_dir for prepared datasets.")
  flags.DEFINE_list("algorithms", list(ALGORITHMS), f"Comma list from {', '.join(ALGORITHMS)}.")
  flags.DEFINE_integer("rounds", 300, "Communication rounds.")
  flags.DEFINE_integer("tau", 5, "Local steps per round.")
  flags.DEFINE_float("learning_rate", 0.01, "Local learning rate of every algorithm.")
  flags.DEFINE_float("comfedl_lr", None, "ComFedL's learning rate (default: --learning_rate).")
  flags.DEFINE_float("gamma", 0.2, "ComFedL KL regularisation gamma.")
  flags.DEFINE_float("drfl_rate", 0.08, "DRFL client-weight learning rate gamma_lambda.")
  flags.DEFINE_float("q", 0.2, "q-FedAvg fairness exponent q.")
  flags.DEFINE_integer("batch_size", 32, "Mini-batch size per client and step.")
  flags.DEFINE_integer("num_clients", 10, "Number of clients.")
  flags.DEFINE_integer("big", None, "Training images of the big client (default per dataset).")
  flags.DEFINE_integer("small", None, "Training images of every other client.")
  flags.DEFINE_integer("eval_every", 5, "Evaluate every this many rounds.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Comma list of integer seeds.")
  flags.DEFINE_enum("sweep", "none", list(SWEEPS), "Run ComFedL's tau or gamma ablation.")
  flags.DEFINE_list("sweep_values", [], "Values for --sweep (default: the paper's).")
  flags.DEFINE_bool("progress", True, "Print a progress line per run.")
  common.define_checkpoint_flags(50)


def validate(workdir, *, dataset="digits", data_dir=None, algorithms=ALGORITHMS, rounds=300,
             tau=5, learning_rate=0.01, comfedl_lr=None, gamma=0.2, drfl_rate=0.08, q=0.2,
             batch_size=32,
             num_clients=10, big=None, small=None, eval_every=5, seeds=(0, 1, 2),
             sweep="none", sweep_values=(), progress=True, checkpoint_every=50,
             resume=True) -> Dict[str, Any]:
  """Checks every setting and returns the run's config; raises ``ValueError`` naming the flag."""
  if dataset not in DATASETS:
    raise ValueError(f"--dataset must be one of {DATASETS}, got {dataset!r}")
  algorithms = common.check_names("algorithms", algorithms, ALGORITHMS)
  if sweep not in SWEEPS:
    raise ValueError(f"--sweep must be one of {SWEEPS}, got {sweep!r}")
  for name, value in (("rounds", rounds), ("tau", tau), ("batch_size", batch_size),
                      ("num_clients", num_clients), ("eval_every", eval_every)):
    common.check_int(name, value, 1)
  for name, value in (("learning_rate", learning_rate), ("gamma", gamma),
                      ("drfl_rate", drfl_rate)):
    common.check_positive(name, value)
  common.check_positive("q", q, allow_zero=True)
  comfedl_lr = learning_rate if comfedl_lr is None else common.check_positive("comfedl_lr",
                                                                               comfedl_lr)
  if "drfl" in algorithms and tau < 2:
    raise ValueError(f"--tau must be >= 2 for drfl (its snapshot step is in 1..tau-1), got {tau}")
  default_big, default_small = SIZES[dataset]
  big = default_big if big is None else common.check_int("big", big, 1)
  small = default_small if small is None else common.check_int("small", small, 1)
  try:
    seeds = tuple(int(s) for s in seeds)
  except (TypeError, ValueError):
    raise ValueError(f"--seeds must be a comma list of integers, got {seeds!r}") from None
  if not seeds:
    raise ValueError("--seeds must name at least one seed")
  if sweep == "none":
    values = ()
  else:
    try:
      values = tuple(float(v) for v in (sweep_values or SWEEP_DEFAULTS[sweep]))
    except (TypeError, ValueError):
      raise ValueError(f"--sweep_values must be numbers, got {sweep_values!r}") from None
    for v in values:
      if sweep == "tau":
        common.check_int("sweep_values", int(v) if float(v).is_integer() else v, 1)
      else:
        common.check_positive("sweep_values", v)
  return {"workdir": common.check_workdir(workdir), "dataset": dataset, "data_dir": data_dir,
          "algorithms": algorithms, "rounds": rounds, "tau": tau,
          "learning_rate": learning_rate, "comfedl_lr": comfedl_lr, "gamma": gamma,
          "drfl_rate": drfl_rate, "q": q,
          "batch_size": batch_size, "num_clients": num_clients, "big": big, "small": small,
          "eval_every": eval_every, "seeds": seeds, "sweep": sweep, "sweep_values": values,
          "progress": progress, **common.checkpoint_config(checkpoint_every, resume)}


def build_data(splits, config, seed: int):
  """The quantity-skewed federated split with matched validation sets."""
  train, test = splits
  parts = partition.quantity_skew(train["y"], config["num_clients"], config["big"],
                                  config["small"], seed)
  val_parts = partition.matched_validation(parts, train["y"], test["y"], seed)
  num_classes = int(max(train["y"].max(), test["y"].max()) + 1)
  return make_federated(train, test, parts, val_parts, config["dataset"], num_classes)


def runs(config) -> List[Dict[str, Any]]:
  """The (label, algorithm, hyperparameters) runs the config asks for."""
  if config["sweep"] == "none":
    return [{"label": a, "algorithm": a, "tau": config["tau"], "gamma": config["gamma"]}
            for a in config["algorithms"]]
  key = config["sweep"]
  out = []
  for v in config["sweep_values"]:
    v = int(v) if key == "tau" else float(v)
    run = {"label": f"comfedl_{key}={v:g}", "algorithm": "comfedl", "tau": config["tau"],
           "gamma": config["gamma"]}
    run[key] = v
    out.append(run)
  return out


def make(run, config, loss):
  """The problem and algorithm of one run."""
  lr, tau = config["learning_rate"], run["tau"]
  name = run["algorithm"]
  if name == "comfedl":
    return (fedco.problems.client_kl_dro(loss, run["gamma"]),
            fedco.comfedl(config["comfedl_lr"], tau))
  if name == "comfedl_normalized":
    return (fedco.problems.client_kl_dro(loss, run["gamma"]),
            fedco.comfedl(config["comfedl_lr"], tau, normalized=True, gamma=run["gamma"]))
  erm = fedco.plain(loss, name="cross_entropy")
  if name == "drfl":
    return erm, fedco.drfa(lr, tau, weights_lr=config["drfl_rate"])
  if name == "qfedavg":
    return erm, fedco.qfedavg(lr, tau, q=config["q"])
  return erm, fedco.fedavg(lr, tau, weighting="samples")


def logistic_model():
  """E1's model and its per-example ``loss`` and ``stats`` (loss, accuracy) functions."""
  model = models.LogisticRegression(num_classes=10)

  def loss(params, example):
    return models.cross_entropy(model.apply(params, example["x"]), example["y"])

  def stats(params, example):
    logits = model.apply(params, example["x"])
    return models.cross_entropy(logits, example["y"]), models.accuracy(logits, example["y"])

  return model, loss, stats


def run(workdir, **kwargs) -> Dict[str, Any]:
  """Runs E1 (or an ablation) and writes the outputs; returns the summary."""
  config = validate(workdir, **kwargs)
  splits = fedco.data.load(config["dataset"], config["data_dir"])
  wd = common.Workdir(config["workdir"])
  wd.write_config(config)
  common.start_checkpoints(wd, config)
  model, loss, stats = logistic_model()
  records, finals = [], {}
  for seed in config["seeds"]:
    fed = build_data((splits.train, splits.test), config, seed)
    params = models.init_params(model, fed.train.examples["x"][0], seed)

    def metrics_fn(p, fed=fed, gamma=None):
      out = {}
      for split, data in (("train", fed.train), ("val", fed.val)):
        losses, accs = metrics_lib.per_client_mean(stats, p, data)
        out[f"{split}_acc_avg"], out[f"{split}_acc_worst"] = metrics_lib.summarize(accs,
                                                                                  worst="min")
        out[f"{split}_loss_avg"], out[f"{split}_loss_worst"] = metrics_lib.summarize(losses,
                                                                                    worst="max")
        if split == "train" and gamma is not None:
          out["client_weights"] = kl_dro_weights(losses, gamma)
      return out

    for spec in runs(config):
      problem, algorithm = make(spec, config, loss)
      gamma = spec["gamma"] if spec["algorithm"] in COMFEDL else None
      try:
        result = fedco.simulate(
            problem, algorithm, fed.train, params, rounds=config["rounds"], seed=seed,
            batch_size=config["batch_size"], evaluate=False, eval_every=config["eval_every"],
            metrics_fn=lambda p, gamma=gamma: metrics_fn(p, gamma=gamma),
            progress=config["progress"], progress_metric="val_acc_worst",
            **common.checkpoint_args(config, f"{spec['label']}-seed{seed}", **spec, seed=seed))
      except fedco.runtime.NonFiniteError as err:  # report a diverged run, keep the others
        flag = "comfedl_lr" if spec["algorithm"] in COMFEDL else "learning_rate"
        finals.setdefault(spec["label"], {})[seed] = {
            "diverged": f"diverged at round {err.round} ({err.quantity}); try a lower --{flag}",
            "diverged_round": err.round, "diverged_quantity": err.quantity,
            "message": str(err)}
        records.extend(common.evaluated_records(
            err.metrics, lambda _, s=spec: {"algorithm": s["label"], "seed": seed},
            finite_only=True))
        continue
      m = result.metrics
      records.extend(common.evaluated_records(
          m, lambda _, s=spec: {"algorithm": s["label"], "seed": seed}))
      final = common.final_metrics(m)
      if not all(np.isfinite(list(final.values()))):
        final["diverged"] = "non-finite final metrics"
      finals.setdefault(spec["label"], {})[seed] = final
  wd.append_metrics(records)
  summary = summarize(finals, config)
  wd.write_summary(summary)
  plot(wd, records, config)
  if config["progress"]:
    print(common.format_table(summary["table"]))
  return summary


def summarize(finals, config) -> Dict[str, Any]:
  per_algorithm, table = common.seed_statistics(
      finals, ("val_acc_avg", "val_acc_worst", "train_acc_avg", "train_acc_worst"))
  summary = {"dataset": config["dataset"], "rounds": config["rounds"],
             "seeds": list(config["seeds"]), "algorithms": per_algorithm, "table": table}
  for name in COMFEDL:
    if {name, "fedavg"} <= set(finals):
      summary[f"{name}_worst_val_at_least_fedavg"] = {
          seed: (finals[name].get(seed, {}).get("val_acc_worst", float("nan"))
                 >= finals["fedavg"].get(seed, {}).get("val_acc_worst", float("nan")))
          for seed in config["seeds"]}
      ours, base = per_algorithm[name]["val_acc_worst"], per_algorithm["fedavg"]["val_acc_worst"]
      summary[f"{name}_mean_worst_val_at_least_fedavg"] = (
          None if ours["mean"] is None or base["mean"] is None else ours["mean"] >= base["mean"])
  return summary


def plot(wd, records, config):
  fig = common.figure(figsize=(10, 4))
  axes = fig.subplots(1, 2)
  labels = sorted({r["algorithm"] for r in records})
  for ax, key, title in zip(axes, ("val_acc_avg", "val_acc_worst"),
                            ("average client accuracy", "worst client accuracy")):
    common.plot_mean_curves(ax, records, key, labels=labels, label_names=LABELS)
    ax.set_xlabel("round")
    ax.set_ylabel(f"validation {title}")
    ax.set_title(f"{config['dataset']}: {title}")
    ax.grid(alpha=0.3)
  common.save_with_legend(wd, fig, axes[0], "accuracy.png", legend=bool(labels))


def main(argv):
  del argv
  common.quiet_logs()
  try:
    run(FLAGS.workdir, dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
        algorithms=FLAGS.algorithms, rounds=FLAGS.rounds, tau=FLAGS.tau,
        learning_rate=FLAGS.learning_rate, comfedl_lr=FLAGS.comfedl_lr, gamma=FLAGS.gamma,
        drfl_rate=FLAGS.drfl_rate,
        q=FLAGS.q, batch_size=FLAGS.batch_size, num_clients=FLAGS.num_clients, big=FLAGS.big,
        small=FLAGS.small, eval_every=FLAGS.eval_every, seeds=FLAGS.seeds, sweep=FLAGS.sweep,
        sweep_values=FLAGS.sweep_values, progress=FLAGS.progress,
        checkpoint_every=FLAGS.checkpoint_every, resume=FLAGS.resume)
  except (ValueError, FileNotFoundError, ImportError) as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
