r"""E2: personalised federated learning on heterogeneous CIFAR-10 (paper 001, Sec. 5.2).

Ten clients; client ``i`` holds a fraction ``rho`` of its ``--per_client`` training images
from class ``i`` and ``(1 - rho) / 9`` from each other class (``fedco.data.dominant_class``;
paper: ``rho = 0.28``), and a validation set drawn from the test split with the same class
mix (``matched_validation``: ``|test| / |train|`` of the client's size, 100 images for 500
CIFAR-10 training images). Model: the 4-layer CNN of MAML (``fedco.models.CNN4``, GroupNorm
instead of batch norm because fedco applies the model to one image at a time). Every
algorithm starts from the same initial model per seed and runs ``tau = --local_steps = 5``
local steps per round with mini-batches of ``--batch_size``; the paper's settings:

==================  ==========================================================================
``comfedl_damaml``  ``fedco.comfedl(0.1)`` on DA-MAML, ``exp((L_k(w - 0.05 grad L_k(w)) -
                    shift) / gamma)``, ``gamma = 0.5`` (paper 001 eq. 10)
``comfedl_maml``    ``fedco.comfedl(0.1)`` on MAML with inner lr 0.05 (eq. 7)
``fedavg``          ``fedco.fedavg(0.1)`` on the cross-entropy, fine-tuned by one step of 0.1
                    before evaluation ("for fair comparison, FedAvg is trained with one step
                    at test time")
``fedmaml``         ``fedco.fedmaml(0.1)`` on MAML with inner lr 0.1
``tr_maml``         ``fedco.tr_maml(0.1, weights_lr=0.08)`` on MAML with inner lr 0.05
``ditto``           ``fedco.ditto(0.2, lam=0.1)`` on the cross-entropy; personal models
==================  ==========================================================================

MAML here is :func:`fedco.problems.personalized.personalized_maml` (one task per client:
the inner map is ``w - a grad l(w; x, y)`` per image, its batch mean the adapted model on the
support batch; the outer the loss on an independent query batch; exact second order unless
``--first_order``).

**Evaluation** ("validation loss and accuracy after one personalization step"): at round 0,
every ``--eval_every`` rounds and at the end, each client ``k`` takes the server model, makes
ONE gradient step on the mean loss over ALL of its training images (deterministic; the rate
is the algorithm's inner lr, FedAvg's ``--finetune_lr``) and is scored on its validation set.
Ditto's clients are scored with their personal models as they are (no extra step). Reported:
mean and worst client validation accuracy, mean and worst validation loss, the same mean
accuracy/loss of the shared model without personalisation (``*_global``), the per-client
accuracies, and TR-MAML's client weights ``p``. The evaluation is one jitted program
(``lax.map`` over chunks of ``--eval_chunk`` clients, each chunk vmapped) shared by all
algorithms; it runs between chunks of ``fedco.Simulator.run``, which is how Ditto's personal
models (simulator state) are reached.

Ablations (ComFedL-DAMAML only, the paper's Figs. 5-6): ``--sweep=tau`` (``--local_steps``
in 1, 2, 5, 10), ``--sweep=gamma`` (0.1, 0.5, 1, 5: the paper's grid) and ``--sweep=rho``
(0.1 = balanced, 0.28, 0.6, 0.8); ``--sweep_values`` overrides.

Datasets: ``--dataset=cifar10`` reads TFDS ``cifar10`` prepared as array_record under
``--data_dir`` (see ``fedco.data.sources``); ``--dataset=digits`` is the offline stand-in
(scikit-learn's 8x8 digits, 1347 training images): images are upsampled 2x by pixel
repetition to 16x16x1, the smallest input ``CNN4``'s four 2x2 pools accept, and
``--per_client`` defaults to 120 (each class must supply ``per_client`` images: the 10
clients together take ``rho + 9 (1 - rho)/9 = 1`` client's worth of every class).

    python -m experiments.personalized_cifar --workdir=runs/e2 --dataset=digits  # offline
    python -m experiments.personalized_cifar --workdir=runs/e2 --data_dir=~/tensorflow_datasets
    python -m experiments.personalized_cifar --workdir=runs/e2_rho --sweep=rho

Rounds: the paper gives none. The default 300 for CIFAR-10 (500 images per client: 300
rounds of 5 batches of 32 are about 100 local epochs) is meant for an accelerator; on 2 CPU
cores a round of the four MAML-type algorithms takes seconds each. Digits defaults to 30
rounds (ComFedL-MAML passes 0.95 mean validation accuracy by round 15). ``--per_client=5000``
uses the whole CIFAR-10 training split (the partition's maximum; lower ``--eval_chunk``
then, since evaluation holds a chunk of clients' whole training sets).

**DA-MAML at the paper's settings diverges.** ComFedL's step on ``exp((L - shift)/gamma)``
is ``exp((L - shift)/gamma) / gamma`` times the MAML gradient: about 200 at ``gamma = 0.5``,
``shift = 0`` and a loss near ``log 10``, so ``--comfedl_lr=0.1`` diverges within 5 rounds on
digits; the factor grows with the loss (positive feedback) and falls by ``e^2`` per unit of
loss decrease. ``--shift=s`` multiplies it by ``exp(-s/gamma)`` (same minimisers: a
learning-rate change for DA-MAML only; float32 holds ``(L - s)/gamma < 88``). Measured on
digits (seed 0, 20 rounds, validation accuracy after one step): ``shift`` 2.3 still
diverges, 3 trains slowly (0.68, ComFedL-MAML 0.97), 4 nearly stalls (0.30); with
``shift = 0``, ``gamma`` 0.1, 0.5 and 1 diverge by round 5 and ``gamma = 5`` reaches 0.87.
The defaults stay the paper's (as in E1); a diverged run is reported (round) in
``summary.json`` and the table instead of stopping the others.

**CPU speed.** XLA:CPU runs convolution gradients 10-60x slower inside ``lax.scan`` (where
fedco's simulator runs every local step) than outside (jax issue #12868). ``CNN4``'s default
``conv_impl="auto"`` therefore computes convolutions as im2col matrix products on the CPU
(``fedco.models.layers``; same parameters and values); ``--conv_impl=xla`` forces
``lax.conv_general_dilated``.

Writes ``config.json``, ``metrics.jsonl`` (+ ``metrics.csv``), ``summary.json`` (per-seed
final values and mean/std over seeds per algorithm) and ``curves.png`` (validation loss,
mean and worst accuracy against rounds, mean over seeds); prints the final table;
checkpoints every run under ``--workdir/checkpoints/`` (rerunning resumes; ``--noresume``
starts over).
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any, Dict, List

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import fedco
from experiments import common
from fedco import models
from fedco.data import partition
from fedco.data.datasets import make_federated
from fedco.problems import personalized

ALGORITHMS = ("comfedl_damaml", "comfedl_maml", "fedavg", "fedmaml", "tr_maml", "ditto")
LABELS = {"comfedl_damaml": "ComFedL-DAMAML", "comfedl_maml": "ComFedL-MAML",
          "fedavg": "FedAvg (+1 step)", "fedmaml": "FedMAML", "tr_maml": "TR-MAML",
          "ditto": "Ditto (personal)"}
DATASETS = ("cifar10", "digits")
PER_CLIENT = {"cifar10": 500, "digits": 120}
ROUNDS = {"cifar10": 300, "digits": 30}
NUM_CLIENTS = 10
NUM_CLASSES = 10
SWEEPS = ("none", "tau", "gamma", "rho")
SWEEP_DEFAULTS = {"tau": (1, 2, 5, 10), "gamma": (0.1, 0.5, 1.0, 5.0),
                  "rho": (0.1, 0.28, 0.6, 0.8)}
SWEPT = "comfedl_damaml"
FINAL_KEYS = ("val_acc_avg", "val_acc_worst", "val_loss_avg", "val_loss_worst",
              "val_acc_global_avg", "val_loss_global_avg")
PER_CLIENT_KEYS = ("val_loss", "val_acc", "val_loss_global", "val_acc_global")

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "Output directory (created if missing).")
  flags.DEFINE_enum("dataset", "cifar10", list(DATASETS),
                    "cifar10 (TFDS, prepared) or digits (offline stand-in).")
  flags.DEFINE_string("data_dir", None, "TFDS data_dir holding cifar10 as array_record.")
  flags.DEFINE_list("algorithms", list(ALGORITHMS), f"Comma list from {', '.join(ALGORITHMS)}.")
  flags.DEFINE_integer("rounds", None, "Communication rounds (default: 300 for cifar10, 30 "
                       "for digits; the paper gives none).")
  flags.DEFINE_integer("local_steps", 5, "tau: local steps per round.")
  flags.DEFINE_integer("batch_size", 32, "Mini-batch size per client and step (each of the "
                       "inner, outer and next-inner batches).")
  flags.DEFINE_integer("per_client", None, "Training images per client (default: 500 for "
                       "cifar10, 120 for digits; 5000 is all of CIFAR-10).")
  flags.DEFINE_float("rho", 0.28, "Fraction of a client's images from its dominant class.")
  flags.DEFINE_integer("filters", 32, "CNN4 channels per convolution.")
  flags.DEFINE_bool("first_order", False, "First-order MAML (drop the Hessian terms).")
  flags.DEFINE_enum("conv_impl", "auto", list(models.layers.CONV_IMPLS),
                    "CNN4's convolutions: im2col matrix products (matmul; auto on the CPU) "
                    "or lax.conv_general_dilated (xla; auto elsewhere).")
  flags.DEFINE_float("comfedl_lr", 0.1, "ComFedL (DA-MAML and MAML) outer learning rate.")
  flags.DEFINE_float("comfedl_inner_lr", 0.05, "ComFedL's MAML inner learning rate.")
  flags.DEFINE_float("gamma", 0.5, "DA-MAML temperature gamma.")
  flags.DEFINE_float("shift", 0.0, "DA-MAML shift: exp((L - shift)/gamma); scales the step "
                     "by exp(-shift/gamma).")
  flags.DEFINE_float("fedavg_lr", 0.1, "FedAvg learning rate.")
  flags.DEFINE_float("finetune_lr", 0.1, "FedAvg's one fine-tuning step before evaluation.")
  flags.DEFINE_float("fedmaml_lr", 0.1, "FedMAML outer learning rate.")
  flags.DEFINE_float("fedmaml_inner_lr", 0.1, "FedMAML inner learning rate.")
  flags.DEFINE_float("trmaml_lr", 0.1, "TR-MAML outer learning rate.")
  flags.DEFINE_float("trmaml_inner_lr", 0.05, "TR-MAML inner learning rate.")
  flags.DEFINE_float("trmaml_weight_lr", 0.08, "TR-MAML client-weight learning rate.")
  flags.DEFINE_float("ditto_lr", 0.2, "Ditto learning rate (global and personal).")
  flags.DEFINE_float("ditto_lam", 0.1, "Ditto proximal weight lambda.")
  flags.DEFINE_integer("eval_every", 5, "Evaluate every this many rounds.")
  flags.DEFINE_integer("eval_chunk", NUM_CLIENTS, "Clients evaluated together (vmapped); "
                       "lower it to save memory.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Comma list of integer seeds.")
  flags.DEFINE_enum("sweep", "none", list(SWEEPS),
                    "Run ComFedL-DAMAML's tau, gamma or rho ablation instead.")
  flags.DEFINE_list("sweep_values", [], "Values for --sweep (default: see the docstring).")
  flags.DEFINE_bool("progress", True, "Print a progress line per run.")
  common.define_checkpoint_flags(50)


def _check_rho(name, value) -> float:
  return common.check_real(name, value, low=0.0, high=1.0, low_open=False)


def validate(workdir, *, dataset="cifar10", data_dir=None, algorithms=ALGORITHMS, rounds=None,
             local_steps=5, batch_size=32, per_client=None, rho=0.28, filters=32,
             first_order=False, conv_impl="auto", comfedl_lr=0.1, comfedl_inner_lr=0.05,
             gamma=0.5, shift=0.0,
             fedavg_lr=0.1, finetune_lr=0.1, fedmaml_lr=0.1, fedmaml_inner_lr=0.1,
             trmaml_lr=0.1, trmaml_inner_lr=0.05, trmaml_weight_lr=0.08, ditto_lr=0.2,
             ditto_lam=0.1, eval_every=5, eval_chunk=NUM_CLIENTS, seeds=(0, 1, 2),
             sweep="none", sweep_values=(), progress=True, checkpoint_every=50,
             resume=True) -> Dict[str, Any]:
  """Checks every setting and returns the run's config; raises ``ValueError`` naming the flag."""
  if dataset not in DATASETS:
    raise ValueError(f"--dataset must be one of {DATASETS}, got {dataset!r}")
  if data_dir is not None and (not isinstance(data_dir, str) or not data_dir.strip()):
    raise ValueError(f"--data_dir must be a folder path, got {data_dir!r}")
  algorithms = common.check_names("algorithms", algorithms, ALGORITHMS)
  if sweep not in SWEEPS:
    raise ValueError(f"--sweep must be one of {SWEEPS}, got {sweep!r}")
  rounds = ROUNDS[dataset] if rounds is None else common.check_int("rounds", rounds, 1)
  for name, value in (("local_steps", local_steps),
                      ("batch_size", batch_size), ("filters", filters),
                      ("eval_every", eval_every), ("eval_chunk", eval_chunk)):
    common.check_int(name, value, 1)
  per_client = (PER_CLIENT[dataset] if per_client is None
                else common.check_int("per_client", per_client, 1))
  rho = _check_rho("rho", rho)
  if not isinstance(first_order, bool):
    raise ValueError(f"--first_order must be a bool, got {first_order!r}")
  if conv_impl not in models.layers.CONV_IMPLS:
    raise ValueError(f"--conv_impl must be one of {models.layers.CONV_IMPLS}, got {conv_impl!r}")
  rates = dict(comfedl_lr=comfedl_lr, comfedl_inner_lr=comfedl_inner_lr, gamma=gamma,
               fedavg_lr=fedavg_lr, finetune_lr=finetune_lr, fedmaml_lr=fedmaml_lr,
               fedmaml_inner_lr=fedmaml_inner_lr, trmaml_lr=trmaml_lr,
               trmaml_inner_lr=trmaml_inner_lr, trmaml_weight_lr=trmaml_weight_lr,
               ditto_lr=ditto_lr)
  rates = {name: common.check_positive(name, value) for name, value in rates.items()}
  ditto_lam = common.check_positive("ditto_lam", ditto_lam, allow_zero=True)
  shift = common.check_real("shift", shift)
  seeds = common.check_int_list("seeds", seeds, 0, distinct=True)
  values = ()
  if sweep != "none":
    raw = tuple(sweep_values) or SWEEP_DEFAULTS[sweep]
    try:
      numbers_ = tuple(float(v) for v in raw)
    except (TypeError, ValueError):
      raise ValueError(f"--sweep_values must be numbers, got {sweep_values!r}") from None
    if sweep == "tau":
      if not all(float(v).is_integer() for v in numbers_):
        raise ValueError(f"--sweep_values must be integers >= 1 for --sweep=tau, got "
                         f"{list(raw)}")
      values = common.check_int_list("sweep_values", [int(v) for v in numbers_], 1,
                                     distinct=True)
    elif sweep == "gamma":
      values = tuple(common.check_positive("sweep_values", v) for v in numbers_)
    else:
      values = tuple(_check_rho("sweep_values", v) for v in numbers_)
    if len(set(values)) != len(values):
      raise ValueError(f"--sweep_values lists a value twice: {list(values)}")
  return {"workdir": common.check_workdir(workdir), "dataset": dataset, "data_dir": data_dir,
          "algorithms": algorithms, "rounds": rounds, "local_steps": local_steps,
          "batch_size": batch_size, "per_client": per_client, "rho": rho,
          "num_clients": NUM_CLIENTS, "filters": filters, "first_order": first_order,
          "conv_impl": conv_impl,
          **rates, "shift": shift, "ditto_lam": ditto_lam, "eval_every": eval_every,
          "eval_chunk": eval_chunk, "seeds": seeds, "sweep": sweep, "sweep_values": values,
          "progress": progress, **common.checkpoint_config(checkpoint_every, resume)}


# ---- data --------------------------------------------------------------------------------

def load_splits(config):
  """Train and test arrays with images ``[N, H, W, C]`` (digits upsampled to 16x16x1)."""
  splits = fedco.data.load(config["dataset"], config["data_dir"])
  if config["dataset"] != "digits":
    return splits
  def up(split):  # 8x8 -> 16x16 by pixel repetition: CNN4 needs H, W >= 16
    x = split["x"].reshape(-1, 8, 8, 1).repeat(2, axis=1).repeat(2, axis=2)
    return {"x": np.ascontiguousarray(x), "y": split["y"]}
  return type(splits)(up(splits.train), up(splits.test))


def build_data(splits, config, rho: float, seed: int):
  """The dominant-class split of SPEC E2 with matched validation sets from the test split."""
  train, test = splits
  try:
    parts = partition.dominant_class(train["y"], NUM_CLIENTS, rho, config["per_client"], seed,
                                     num_classes=NUM_CLASSES)
  except ValueError as err:
    raise ValueError(f"--per_client: {err}") from None
  val_parts = partition.matched_validation(parts, train["y"], test["y"], seed)
  return make_federated(train, test, parts, val_parts, config["dataset"], NUM_CLASSES,
                        info={"partition": "dominant_class", "rho": rho,
                              "per_client": config["per_client"], "seed": seed})


# ---- runs, problems, algorithms ----------------------------------------------------------

def runs(config) -> List[Dict[str, Any]]:
  """The runs the config asks for: label, algorithm and the settings that vary."""
  base = {"tau": config["local_steps"], "gamma": config["gamma"], "rho": config["rho"]}
  if config["sweep"] == "none":
    return [{"label": a, "algorithm": a, **base} for a in config["algorithms"]]
  key = config["sweep"]
  return [{**base, "label": f"{SWEPT}_{key}={v:g}", "algorithm": SWEPT, key: v}
          for v in config["sweep_values"]]


def make(spec, config, apply_fn):
  """``(problem, algorithm, evaluation step size or None for personal models)``."""
  name, tau, fo = spec["algorithm"], spec["tau"], config["first_order"]
  loss = models.cross_entropy

  def maml(inner_lr, gamma=None):
    return personalized.personalized_maml(apply_fn, inner_lr, loss, first_order=fo,
                                          gamma=gamma, shift=config["shift"] if gamma else 0.0)

  erm = fedco.plain(personalized.example_loss(apply_fn, loss), name="cross_entropy")
  if name == "comfedl_damaml":
    return (maml(config["comfedl_inner_lr"], spec["gamma"]),
            fedco.comfedl(config["comfedl_lr"], tau), config["comfedl_inner_lr"])
  if name == "comfedl_maml":
    return (maml(config["comfedl_inner_lr"]), fedco.comfedl(config["comfedl_lr"], tau),
            config["comfedl_inner_lr"])
  if name == "fedavg":
    return erm, fedco.fedavg(config["fedavg_lr"], tau), config["finetune_lr"]
  if name == "fedmaml":
    return (maml(config["fedmaml_inner_lr"]),
            fedco.fedmaml(config["fedmaml_lr"], tau,
                          variant="first_order" if fo else "exact"),
            config["fedmaml_inner_lr"])
  if name == "tr_maml":
    return (maml(config["trmaml_inner_lr"]),
            fedco.tr_maml(config["trmaml_lr"], tau, weights_lr=config["trmaml_weight_lr"]),
            config["trmaml_inner_lr"])
  if name == "ditto":
    return erm, fedco.ditto(config["ditto_lr"], tau, lam=config["ditto_lam"]), None
  raise ValueError(f"unknown algorithm {name!r}")


# ---- evaluation --------------------------------------------------------------------------

def _client_rows(data, start, count):
  """A client's whole (padded) data and its weights (``1/n`` on real rows, 0 on padding)."""
  view = fedco.runtime.ClientView(data.examples, start, count, data.flat_rows)
  return fedco.runtime.draw(None, view, None, data.max_count)


def make_evaluator(apply_fn, chunk: int):
  """``evaluate(server, personal, lr, train, val) -> (val_loss, val_acc, val_loss_global,
  val_acc_global)``, each ``[K]``, jitted.

  Client ``k``'s personalised model is ``personal[k]`` when given (Ditto), else one step of
  ``lr`` on the mean loss of all of its training data from ``server``; ``*_global`` score
  ``server`` itself. Clients run in ``lax.map`` chunks of ``chunk`` (vmapped within).
  """
  loss = models.cross_entropy

  def scores(params, batch, weights):
    logits = jax.vmap(apply_fn, in_axes=(None, 0))(params, batch["x"])
    losses = jax.vmap(loss)(logits, batch["y"])
    hits = (jnp.argmax(logits, -1) == batch["y"]).astype(jnp.float32)
    return jnp.sum(weights * losses), jnp.sum(weights * hits)

  def evaluate(server, personal, lr, train, val):
    def one(args):
      own, t_start, t_count, v_start, v_count = args
      v_batch, v_weights = _client_rows(val, v_start, v_count)
      global_loss, global_acc = scores(server, v_batch, v_weights)
      if own is None:
        t_batch, t_weights = _client_rows(train, t_start, t_count)
        own = personalized.adapt(apply_fn, loss, server, t_batch, t_weights, lr)
      own_loss, own_acc = scores(own, v_batch, v_weights)
      return own_loss, own_acc, global_loss, global_acc

    xs = (personal, train.offsets, train.counts, val.offsets, val.counts)
    return jax.lax.map(one, xs, batch_size=min(chunk, NUM_CLIENTS))

  return jax.jit(evaluate)


@functools.lru_cache(maxsize=8)
def _model(filters: int, conv_impl: str, eval_chunk: int):
  """The model, its apply function and the jitted evaluator, shared by the runs of one
  process (so the evaluator compiles once per data shape, not once per run)."""
  model = models.CNN4(num_classes=NUM_CLASSES, filters=filters, conv_impl=conv_impl)
  apply_fn = model.apply
  return model, apply_fn, make_evaluator(apply_fn, eval_chunk)


def _summary_row(per_client: Dict[str, np.ndarray]) -> Dict[str, Any]:
  return {"val_acc_avg": float(np.mean(per_client["val_acc"])),
          "val_acc_worst": float(np.min(per_client["val_acc"])),
          "val_loss_avg": float(np.mean(per_client["val_loss"])),
          "val_loss_worst": float(np.max(per_client["val_loss"])),
          "val_acc_global_avg": float(np.mean(per_client["val_acc_global"])),
          "val_loss_global_avg": float(np.mean(per_client["val_loss_global"]))}


class Diverged(Exception):
  def __init__(self, round_, what):
    super().__init__(f"round {round_}: {what}")
    self.round = round_


def simulate_run(spec, config, fed, params, seed, evaluator, apply_fn):
  """One (run, seed) through ``fedco.simulate``, evaluated by a host action.

  The action sees the whole simulation state (Ditto's personal models, TR-MAML's task
  weights) at round 0 and every ``eval_every`` rounds; its rows are checkpointed with the
  state, so a resumed run returns every row since round 0. Returns ``(rows, seconds,
  error)``: ``rows`` hold the round, the per-client metrics ``[K]`` (plus
  ``client_weights`` for TR-MAML); ``error`` is a :class:`Diverged` or ``None``.
  """
  problem, algorithm, eval_lr = make(spec, config, apply_fn)
  lr = jnp.float32(0.0 if eval_lr is None else eval_lr)

  def evaluate(state, round_):
    personal = state.clients.personal if eval_lr is None else None
    out = jax.device_get(evaluator(state.server["params"], personal, lr, fed.train, fed.val))
    row = dict(zip(PER_CLIENT_KEYS, out), val_acc_avg=np.mean(out[1]))
    if spec["algorithm"] == "tr_maml":
      row["client_weights"] = np.asarray(state.server_opt_state.p)
    return row

  ckpt_dir = common.checkpoint_args(config, f"{spec['label']}-seed{seed}", **spec,
                                    seed=seed)["checkpoint_dir"]
  start = time.perf_counter()
  try:
    result = fedco.simulate(
        problem, algorithm, fed.train, params, rounds=config["rounds"], seed=seed,
        batch_size=config["batch_size"], evaluate=False, checkpoint_dir=ckpt_dir,
        checkpoint_every=config["checkpoint_every"],
        actions=[fedco.runtime.PeriodicAction(evaluate, config["eval_every"], at_start=True)],
        metric_labels={"algorithm": spec["label"], "seed": seed},
        progress=config["progress"], progress_metric="val_acc_avg")
    rows, error = result.host_metrics, None
  except fedco.runtime.NonFiniteError as err:
    rows, error = err.host_metrics, Diverged(err.round, str(err).split(": ", 1)[-1])
  return rows, time.perf_counter() - start, error


def _records(rows, spec, seed) -> List[Dict[str, Any]]:
  out = []
  for row in rows:
    per_client = {k: np.asarray(row[k]) for k in PER_CLIENT_KEYS}
    if not all(np.all(np.isfinite(v)) for v in per_client.values()):
      break
    rec = {"round": int(row["round"]), "algorithm": spec["label"], "seed": seed,
           **_summary_row(per_client), "val_acc_clients": per_client["val_acc"]}
    if "client_weights" in row:
      rec["client_weights"] = np.asarray(row["client_weights"])
    out.append(rec)
  return out


def run(workdir, **kwargs) -> Dict[str, Any]:
  """Runs E2 (or an ablation) and writes the outputs; returns the summary."""
  config = validate(workdir, **kwargs)
  splits = load_splits(config)
  wd = common.Workdir(config["workdir"])
  wd.write_config(config)
  common.start_checkpoints(wd, config)
  model, apply_fn, evaluator = _model(config["filters"], config["conv_impl"],
                                      config["eval_chunk"])
  image_shape = tuple(splits.train["x"].shape[1:])
  records, finals, sizes = [], {}, {}
  for seed in config["seeds"]:
    params = models.init_cnn(model, image_shape, seed)
    data: Dict[float, Any] = {}
    for spec in runs(config):
      if spec["rho"] not in data:
        data[spec["rho"]] = build_data(splits, config, spec["rho"], seed)
      fed = data[spec["rho"]]
      sizes.setdefault(seed, {"train": fed.train_sizes().tolist(),
                              "val": fed.val_sizes().tolist()})
      rows, seconds, error = simulate_run(spec, config, fed, params, seed, evaluator,
                                          apply_fn)
      recs = _records(rows, spec, seed)
      records.extend(recs)
      if error is not None:
        final = {"diverged": str(error), "diverged_round": error.round}
      elif not recs:
        final = {"diverged": "no finite evaluation"}
      else:
        final = {k: recs[-1][k] for k in FINAL_KEYS}
        final["val_acc_clients"] = recs[-1]["val_acc_clients"]
      final["seconds"] = seconds
      finals.setdefault(spec["label"], {})[seed] = final
  wd.append_metrics(records)
  summary = summarize(finals, config, sizes)
  wd.write_summary(summary)
  plot(wd, records, config)
  if config["progress"]:
    print(common.format_table(summary["table"]))
  return summary


def summarize(finals, config, sizes) -> Dict[str, Any]:
  per_algorithm, table = common.seed_statistics(
      finals, FINAL_KEYS, std_in_table=("val_acc_avg", "val_acc_worst"))
  return {"dataset": config["dataset"], "rounds": config["rounds"],
          "local_steps": config["local_steps"], "rho": config["rho"],
          "per_client": config["per_client"], "sweep": config["sweep"],
          "seeds": list(config["seeds"]), "client_sizes": sizes,
          "algorithms": per_algorithm, "table": table}


def plot(wd, records, config):
  fig = common.figure(figsize=(14, 4))
  axes = fig.subplots(1, 3)
  panels = (("val_loss_avg", "mean validation loss"),
            ("val_acc_avg", "mean validation accuracy"),
            ("val_acc_worst", "worst-client validation accuracy"))
  for ax, (key, title) in zip(axes, panels):
    common.plot_mean_curves(ax, records, key, band=0.15, label_names=LABELS)
    ax.set_xlabel("round")
    ax.set_title(f"{config['dataset']} (rho={config['rho']:g}): {title}", fontsize=9)
    ax.grid(alpha=0.3)
  common.save_with_legend(wd, fig, axes[0], "curves.png", legend=bool(records), fontsize=8)


def main(argv):
  del argv
  common.quiet_logs()
  try:
    run(FLAGS.workdir, dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
        algorithms=FLAGS.algorithms, rounds=FLAGS.rounds, local_steps=FLAGS.local_steps,
        batch_size=FLAGS.batch_size, per_client=FLAGS.per_client, rho=FLAGS.rho,
        filters=FLAGS.filters, first_order=FLAGS.first_order,
        conv_impl=FLAGS.conv_impl, comfedl_lr=FLAGS.comfedl_lr,
        comfedl_inner_lr=FLAGS.comfedl_inner_lr, gamma=FLAGS.gamma, shift=FLAGS.shift,
        fedavg_lr=FLAGS.fedavg_lr, finetune_lr=FLAGS.finetune_lr, fedmaml_lr=FLAGS.fedmaml_lr,
        fedmaml_inner_lr=FLAGS.fedmaml_inner_lr, trmaml_lr=FLAGS.trmaml_lr,
        trmaml_inner_lr=FLAGS.trmaml_inner_lr, trmaml_weight_lr=FLAGS.trmaml_weight_lr,
        ditto_lr=FLAGS.ditto_lr, ditto_lam=FLAGS.ditto_lam, eval_every=FLAGS.eval_every,
        eval_chunk=FLAGS.eval_chunk, seeds=FLAGS.seeds, sweep=FLAGS.sweep,
        sweep_values=FLAGS.sweep_values, progress=FLAGS.progress,
        checkpoint_every=FLAGS.checkpoint_every, resume=FLAGS.resume)
  except (ValueError, FileNotFoundError, ImportError) as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
