r"""E5: imbalanced image classification, CIFAR10-ST / CIFAR100-ST (paper 004 Sec. 6, SPEC E5).

The step-imbalanced training split (the first half of the classes keep their last 2% of
images, :mod:`fedco.data.imbalanced`) is split equally at random over ``--num_clients`` (8)
clients. The problem is sample-level KL-DRO (SPEC 4.2, global-inner)::

    min_x  lam log( 1/N sum_i exp(l_i(x) / lam) )       g = mean_i exp((l_i - shift)/lam), f = lam log

with ``l_i`` the cross-entropy of a ResNet20 (flax, GroupNorm: fedco's losses are
per-example, see :mod:`fedco.models.resnet`). Algorithms (``--algorithms``):

* ``feddro``: FedDRO (paper 004, Alg. 2) with ``I = 1`` (``--local_steps``);
* ``ds_feddro``: DS-FedDRO (Alg. 3), server rates 1.3 / 1.4;
* ``fastdro``: FastDRO (Levy et al. 2020), chi^2 ball (``--fastdro_geometry``,
  ``--fastdro_size``), in parallel form: each client's best response on its own batch;
* ``primal_dual``: primal-dual SGD (weights on all N training rows, projected ascent);
* ``mbsgd``: minibatch SGD for CO (one step per round);
* ``fedavg``: FedAvg for CO, Case II (``--fedavg_local_steps`` local steps; the failing
  baseline of Theorem 4.1).

"Centralised baselines in parallel form" (paper 004): every algorithm uses ``K`` clients x
batch 16 per step, so they all see the same number of examples per step. Every rate is
``--learning_rate`` (the paper picks one of {0.001, 0.01, 0.05, 0.1}) divided by 10 after
``--lr_drop_round`` (90) rounds, through an optax schedule counted in local steps.

Reported at round 1 and every ``--eval_every`` rounds: top-1 accuracy on the training split
(the imbalanced one) and the test split, the test accuracy of the minority half of the
classes, and the KL-DRO objective on the training split. ``--sweep=I`` runs FedDRO and
DS-FedDRO over ``I in {1, 2, 4, 8, 16, 32}`` (the paper's ablation). 3 seeds, mean and std.

    python -m experiments.imbalanced_cifar --workdir=runs/e5 --data_dir=~/tensorflow_datasets
    python -m experiments.imbalanced_cifar --workdir=runs/e5_100 --dataset=cifar100
    python -m experiments.imbalanced_cifar --workdir=runs/e5_I --sweep=I
    python -m experiments.imbalanced_cifar --workdir=runs/e5_digits --dataset=digits \
        --model=resnet20 --rounds=200            # offline stand-in (digits-ST), minutes

CIFAR needs the TFDS data prepared in ``array_record`` format (see :mod:`fedco.data.sources`);
a ResNet20 step on 128 images is about a second on a 2-core CPU, so the paper-sized runs are
for an accelerator. Writes ``config.json``, ``metrics.jsonl``, ``summary.json`` and
``accuracy.png``.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Dict, List

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedco
from experiments import common
from fedco.data import imbalanced, partition, sources
from fedco.models import CNN4, LogisticRegression, ResNet20, accuracy, cross_entropy
from fedco.models.layers import CONV_IMPLS

ALGORITHMS = ("feddro", "ds_feddro", "fastdro", "primal_dual", "mbsgd", "fedavg")
LABELS = {"feddro": "FedDRO", "ds_feddro": "DS-FedDRO", "fastdro": "FastDRO",
          "primal_dual": "PD-SGD", "mbsgd": "MBSGD", "fedavg": "FedAvg (Case II)"}
LOCAL = ("feddro", "ds_feddro")
SWEEPS = ("none", "I")
SWEEP_DEFAULT = (1, 2, 4, 8, 16, 32)
MODELS = ("resnet20", "cnn4", "linear")
FINAL_KEYS = ("test_acc", "train_acc", "test_minority_acc", "train_objective")
_EVAL_CHUNK = 256

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "Output directory (created if missing).")
  flags.DEFINE_enum("dataset", "cifar10", list(imbalanced.ST_DATASETS),
                    "cifar10 / cifar100 (TFDS, -ST version) or digits (offline stand-in).")
  flags.DEFINE_string("data_dir", None, "TFDS data directory (array_record format).")
  flags.DEFINE_enum("model", "resnet20", list(MODELS), "ResNet20 (paper), CNN4 or linear.")
  flags.DEFINE_integer("width", 16, "ResNet20 base width (16: the CIFAR ResNet20).")
  flags.DEFINE_enum("conv_impl", "auto", ["auto", "matmul", "xla"],
                    "ResNet20/CNN4 convolutions: im2col matrix products (matmul; auto on the "
                    "CPU, fast inside the simulator's loops, slower to compile) or "
                    "lax.conv_general_dilated (xla; auto elsewhere).")
  flags.DEFINE_list("algorithms", list(ALGORITHMS), f"Comma list from {', '.join(ALGORITHMS)}.")
  flags.DEFINE_integer("num_clients", 8, "Clients (equal random split of the training rows).")
  flags.DEFINE_integer("rounds", 120, "Communication rounds.")
  flags.DEFINE_list("local_steps", ["1"], "I for FedDRO and DS-FedDRO; several values run each.")
  flags.DEFINE_integer("fedavg_local_steps", 5, "Local steps of FedAvg (Case II).")
  flags.DEFINE_enum("sweep", "none", list(SWEEPS), "I: FedDRO/DS-FedDRO over --sweep_values.")
  flags.DEFINE_list("sweep_values", [], f"Values of I for --sweep=I (default {SWEEP_DEFAULT}).")
  flags.DEFINE_integer("batch_size", 16, "Mini-batch size per client and step.")
  flags.DEFINE_float("learning_rate", 0.01, "Client SGD rate of every algorithm.")
  flags.DEFINE_integer("lr_drop_round", 90, "Divide the rate by 10 after this many rounds.")
  flags.DEFINE_float("lam", 1.0, "KL-DRO temperature lambda.")
  flags.DEFINE_float("shift", 0.0, "Constant shift of the loss inside exp (numerics only).")
  flags.DEFINE_float("beta", 0.5, "FedDRO/DS-FedDRO tracker rate beta in (0, 1].")
  flags.DEFINE_float("server_lr_x", 1.3, "DS-FedDRO server rate for the model.")
  flags.DEFINE_float("server_lr_y", 1.4, "DS-FedDRO server rate for the inner value.")
  flags.DEFINE_enum("fastdro_geometry", "chi2", ["chi2", "cvar"], "FastDRO uncertainty set.")
  flags.DEFINE_float("fastdro_size", 1.0, "chi^2 radius rho, or CVaR level alpha in (0, 1].")
  flags.DEFINE_float("pd_weights_lr", 1e-4, "Primal-dual SGD ascent rate on the weights.")
  flags.DEFINE_float("keep_fraction", 0.02, "Fraction of each minority class kept.")
  flags.DEFINE_integer("eval_examples", 0, "Evaluate on this many rows of each split "
                       "(a fixed random subset); 0 = all.")
  flags.DEFINE_integer("eval_every", 10, "Evaluate every this many rounds (and round 1).")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Comma list of integer seeds.")
  flags.DEFINE_bool("progress", True, "Print a progress line per run and the final table.")
  common.define_checkpoint_flags(50)


def validate(workdir, *, dataset="cifar10", data_dir=None, model="resnet20", width=16,
             conv_impl="auto",
             algorithms=ALGORITHMS, num_clients=8, rounds=120, local_steps=(1,),
             fedavg_local_steps=5, sweep="none", sweep_values=(), batch_size=16,
             learning_rate=0.01, lr_drop_round=90, lam=1.0, shift=0.0, beta=0.5,
             server_lr_x=1.3, server_lr_y=1.4, fastdro_geometry="chi2", fastdro_size=1.0,
             pd_weights_lr=1e-4, keep_fraction=0.02, eval_examples=0, eval_every=10,
             seeds=(0, 1, 2), progress=True, checkpoint_every=50,
             resume=True) -> Dict[str, Any]:
  """Checks every setting and returns the run's config; raises ``ValueError`` naming the flag."""
  if dataset not in imbalanced.ST_DATASETS:
    raise ValueError(f"--dataset must be one of {imbalanced.ST_DATASETS}, got {dataset!r}")
  if model not in MODELS:
    raise ValueError(f"--model must be one of {MODELS}, got {model!r}")
  if conv_impl not in CONV_IMPLS:
    raise ValueError(f"--conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}")
  algorithms = common.check_names("algorithms", algorithms, ALGORITHMS)
  if sweep not in SWEEPS:
    raise ValueError(f"--sweep must be one of {SWEEPS}, got {sweep!r}")
  if fastdro_geometry not in ("chi2", "cvar"):
    raise ValueError(f"--fastdro_geometry must be chi2 or cvar, got {fastdro_geometry!r}")
  for name, value in (("width", width), ("num_clients", num_clients), ("rounds", rounds),
                      ("fedavg_local_steps", fedavg_local_steps), ("batch_size", batch_size),
                      ("lr_drop_round", lr_drop_round), ("eval_every", eval_every)):
    common.check_int(name, value, 1)
  common.check_int("eval_examples", eval_examples, 0)
  for name, value in (("learning_rate", learning_rate), ("lam", lam),
                      ("server_lr_x", server_lr_x), ("server_lr_y", server_lr_y),
                      ("fastdro_size", fastdro_size), ("pd_weights_lr", pd_weights_lr)):
    common.check_positive(name, value)
  if fastdro_geometry == "cvar":
    common.check_real("fastdro_size", fastdro_size, low=0.0, high=1.0)
  common.check_real("shift", shift)
  common.check_real("beta", beta, low=0.0, high=1.0)
  common.check_real("keep_fraction", keep_fraction, low=0.0, high=1.0)
  local_steps = common.check_int_list("local_steps", local_steps, 1, distinct=True)
  if sweep == "I":
    local_steps = common.check_int_list("sweep_values", sweep_values or SWEEP_DEFAULT, 1,
                                        distinct=True)
    algorithms = tuple(a for a in algorithms if a in LOCAL)
    if not algorithms:
      raise ValueError("--sweep=I needs feddro or ds_feddro in --algorithms")
  elif sweep_values:
    raise ValueError("--sweep_values needs --sweep=I")
  seeds = common.check_int_list("seeds", seeds, 0, distinct=True)
  if data_dir is not None and (not isinstance(data_dir, str) or not data_dir.strip()):
    raise ValueError(f"--data_dir must be a folder path, got {data_dir!r}")
  return {"workdir": common.check_workdir(workdir), "dataset": dataset, "data_dir": data_dir,
          "model": model, "width": width, "conv_impl": conv_impl, "algorithms": algorithms,
          "num_clients": num_clients, "rounds": rounds, "local_steps": local_steps,
          "fedavg_local_steps": fedavg_local_steps, "sweep": sweep,
          "batch_size": batch_size, "learning_rate": learning_rate,
          "lr_drop_round": lr_drop_round, "lam": lam, "shift": shift, "beta": beta,
          "server_lr_x": server_lr_x, "server_lr_y": server_lr_y,
          "fastdro_geometry": fastdro_geometry, "fastdro_size": fastdro_size,
          "pd_weights_lr": pd_weights_lr, "keep_fraction": keep_fraction,
          "eval_examples": eval_examples, "eval_every": eval_every, "seeds": seeds,
          "progress": progress, **common.checkpoint_config(checkpoint_every, resume)}


def runs(config) -> List[Dict[str, Any]]:
  """One spec per (algorithm, I): FedDRO and DS-FedDRO once per ``I``."""
  several = len(config["local_steps"]) > 1
  out = []
  for name in config["algorithms"]:
    if name in LOCAL:
      for steps in config["local_steps"]:
        out.append({"label": f"{name}_I={steps}" if several else name, "algorithm": name,
                    "local_steps": steps})
    elif name == "fedavg":
      out.append({"label": name, "algorithm": name,
                  "local_steps": config["fedavg_local_steps"]})
    else:
      out.append({"label": name, "algorithm": name, "local_steps": 1})
  return out


def make_model(config, num_classes: int):
  if config["model"] == "resnet20":
    return ResNet20(num_classes=num_classes, width=config["width"],
                    conv_impl=config["conv_impl"])
  if config["model"] == "cnn4":
    return CNN4(num_classes=num_classes, conv_impl=config["conv_impl"])
  return LogisticRegression(num_classes)


def optimizer(config, local_steps: int):
  """SGD at ``--learning_rate``, divided by 10 after ``--lr_drop_round`` rounds."""
  schedule = optax.piecewise_constant_schedule(
      config["learning_rate"], {config["lr_drop_round"] * local_steps: 0.1})
  return optax.sgd(schedule)


def make(spec, config, loss, num_examples: int):
  """The problem and algorithm of one run."""
  name, steps = spec["algorithm"], spec["local_steps"]
  opt = optimizer(config, steps)  # carries --learning_rate (and its drop), so no learning_rate
  kl = fedco.problems.sample_kl_dro(loss, config["lam"], shift=config["shift"])
  erm = fedco.plain(loss)
  if name == "feddro":
    return kl, fedco.feddro(local_steps=steps, beta=config["beta"], optimizer=opt)
  if name == "ds_feddro":
    return kl, fedco.ds_feddro(local_steps=steps, beta=config["beta"],
                               server_lr_x=config["server_lr_x"],
                               server_lr_y=config["server_lr_y"], optimizer=opt)
  if name == "fastdro":
    return erm, fedco.fastdro(geometry=config["fastdro_geometry"],
                              size=config["fastdro_size"], optimizer=opt)
  if name == "primal_dual":
    return erm, fedco.primal_dual_dro(num_examples=num_examples,
                                      weights_lr=config["pd_weights_lr"], optimizer=opt)
  if name == "mbsgd":
    return kl, fedco.mbsgd(optimizer=opt)
  return kl, fedco.fedavg_co(local_steps=steps, case="II", optimizer=opt)


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
    split = _subset(split, config["eval_examples"], 0)
    n = len(split["y"])
    pad = (-n) % _EVAL_CHUNK
    x = np.concatenate([split["x"], np.zeros((pad,) + split["x"].shape[1:], split["x"].dtype)])
    y = np.concatenate([split["y"], np.zeros(pad, split["y"].dtype)])
    real = np.arange(n + pad) < n
    splits[name] = tuple(jnp.asarray(a.reshape((-1, _EVAL_CHUNK) + a.shape[1:]))
                         for a in (x, y, real))
  lam, minority = config["lam"], num_classes // 2

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


def run(workdir, **kwargs) -> Dict[str, Any]:
  """Runs E5 (or its ablation over I) and writes the outputs; returns the summary."""
  start = time.perf_counter()
  config = validate(workdir, **kwargs)
  train, test = imbalanced.load_st(config["dataset"], config["data_dir"],
                                   keep_fraction=config["keep_fraction"])
  num_classes = sources.num_classes(config["dataset"])
  if config["model"] != "linear":
    train, test = as_images(train), as_images(test)
  wd = common.Workdir(config["workdir"])
  wd.write_config({**config, "train_examples": int(len(train["y"])),
                   "test_examples": int(len(test["y"])), "num_classes": num_classes})
  common.start_checkpoints(wd, config)
  model = make_model(config, num_classes)
  apply_fn = model.apply
  loss = lambda params, e: cross_entropy(apply_fn(params, e["x"]), e["y"])
  metrics_fn = metrics_fn_for(apply_fn, train, test, num_classes, config)
  examples = {"x": jnp.asarray(train["x"]), "y": jnp.asarray(train["y"])}
  records, finals = [], {}
  for seed in config["seeds"]:
    parts = partition.iid(len(train["y"]), config["num_clients"], seed)
    data = fedco.FederatedData.from_index_lists(examples, parts)
    params = model.init(jax.random.PRNGKey(seed), examples["x"][0])
    for spec in runs(config):
      problem, algorithm = make(spec, config, loss, len(train["y"]))
      common.simulate_and_record(
          lambda: fedco.simulate(
              problem, algorithm, data, params, rounds=config["rounds"], seed=seed,
              batch_size=config["batch_size"], evaluate=False,
              eval_every=config["eval_every"], metrics_fn=metrics_fn,
              progress=config["progress"], progress_metric="test_acc",
              **common.checkpoint_args(config, f"{spec['label']}-seed{seed}", **spec,
                                       seed=seed)),
          spec["label"], seed, _fields(spec, seed), records, finals)
  wd.append_metrics(records)
  summary = summarize(finals, config, time.perf_counter() - start)
  wd.write_summary(summary)
  plot(wd, records, config)
  if config["progress"]:
    print(common.format_table(summary["table"]))
    print(f"wall time {summary['seconds']:.1f} s")
  return summary


def _fields(spec, seed):
  return lambda _: {"algorithm": spec["label"], "seed": seed,
                    "local_steps": spec["local_steps"]}


def summarize(finals, config, seconds) -> Dict[str, Any]:
  per_algorithm, table = common.seed_statistics(finals, FINAL_KEYS, std_in_table=FINAL_KEYS)
  return {"dataset": f"{config['dataset']}-ST", "model": config["model"],
          "rounds": config["rounds"], "num_clients": config["num_clients"],
          "seeds": list(config["seeds"]), "algorithms": per_algorithm, "table": table,
          "seconds": seconds}


def plot(wd, records, config):
  fig = common.figure(figsize=(11, 8))
  axes = fig.subplots(2, 2)
  panels = (("train_acc", "train accuracy"), ("test_acc", "test accuracy"),
            ("test_minority_acc", "test accuracy, minority classes"),
            ("train_objective", "train KL-DRO objective"))
  for ax, (key, title) in zip(axes.ravel(), panels):
    common.plot_mean_curves(ax, records, key, band=0.2,
                            label_names=common.sweep_label_names(LABELS),
                            skip_missing=True)
    ax.set_xlabel("round")
    ax.set_ylabel(title)
    ax.set_title(f"{config['dataset']}-ST, {config['num_clients']} clients: {title}")
    ax.grid(alpha=0.3)
  common.save_with_legend(wd, fig, axes[0, 0], "accuracy.png", legend=bool(records))


def main(argv):
  del argv
  common.quiet_logs()
  try:
    run(FLAGS.workdir, dataset=FLAGS.dataset, data_dir=FLAGS.data_dir, model=FLAGS.model,
        width=FLAGS.width, conv_impl=FLAGS.conv_impl, algorithms=FLAGS.algorithms, num_clients=FLAGS.num_clients,
        rounds=FLAGS.rounds, local_steps=FLAGS.local_steps,
        fedavg_local_steps=FLAGS.fedavg_local_steps, sweep=FLAGS.sweep,
        sweep_values=FLAGS.sweep_values, batch_size=FLAGS.batch_size,
        learning_rate=FLAGS.learning_rate, lr_drop_round=FLAGS.lr_drop_round, lam=FLAGS.lam,
        shift=FLAGS.shift, beta=FLAGS.beta, server_lr_x=FLAGS.server_lr_x,
        server_lr_y=FLAGS.server_lr_y, fastdro_geometry=FLAGS.fastdro_geometry,
        fastdro_size=FLAGS.fastdro_size, pd_weights_lr=FLAGS.pd_weights_lr,
        keep_fraction=FLAGS.keep_fraction, eval_examples=FLAGS.eval_examples,
        eval_every=FLAGS.eval_every, seeds=FLAGS.seeds, progress=FLAGS.progress,
        checkpoint_every=FLAGS.checkpoint_every, resume=FLAGS.resume)
  except (ValueError, FileNotFoundError) as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
