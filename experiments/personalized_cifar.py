r"""E2: personalised federated learning on heterogeneous CIFAR-10 (paper 001, Sec. 5.2).

Ten clients; client ``i`` holds a fraction ``config.rho`` of its ``config.per_client``
training images from class ``i`` and ``(1 - rho) / 9`` from each other class
(``fedco.data.dominant_class``; paper: ``rho = 0.28``), and a validation set drawn from the
test split with the same class mix (``matched_validation``: ``|test| / |train|`` of the
client's size, 100 images for 500 CIFAR-10 training images). Model: the 4-layer CNN of MAML
(``fedco.models.CNN4``, GroupNorm instead of batch norm because fedco applies the model to
one image at a time). Every method starts from the same initial model per seed and runs
``local_steps = 5`` (tau) local steps per round with mini-batches of ``batch_size``. The
methods are ``config.methods``, each an algorithm (``fedco.ALGORITHMS``) with its arguments
and a ``problem`` (``name`` and its settings); the paper's settings (outer rate
``learning_rate = 0.1`` unless given):

=============================  ===================================================================
``comfedl_damaml``             ``comfedl`` on DA-MAML, ``exp((L_k(w - 0.05 grad L_k(w)) - shift) /
                               gamma)``, ``gamma = 0.5`` (paper 001 eq. 10; ``problem.inner_lr =
                               0.05``)
``comfedl_damaml_normalized``  the same with normalised client weights ``exp(L_k/gamma - L)`` over
                               the round's clients (``fedco.comfedl(normalized=True)``; not in the
                               paper: stable where the literal step diverges)
``comfedl_maml``               ``comfedl`` on MAML with ``problem.inner_lr = 0.05`` (eq. 7)
``fedavg``                     ``fedavg`` on the cross-entropy, fine-tuned by one step of
                               ``problem.finetune_lr = 0.1`` before evaluation ("for fair
                               comparison, FedAvg is trained with one step at test time")
``fedmaml``                    ``fedmaml`` on MAML with ``problem.inner_lr = 0.1``
``tr_maml``                    ``tr_maml`` (``weights_lr = 0.08``) on MAML with ``problem.inner_lr
                               = 0.05``
``ditto``                      ``ditto`` (``learning_rate = 0.2``, ``lam = 0.1``) on the
                               cross-entropy; scored with its personal models
``fedrep``, ``fedper``         ``fedrep`` (4 head steps, then 1 body step) and ``fedper`` on the
                               cross-entropy, CNN4's ``logits`` layer the private head; scored
                               with each client's head on the shared body
``apfl``                       ``apfl`` (adaptive ``alpha`` from 0.25) on the cross-entropy;
                               scored with each client's mixture
=============================  ===================================================================

MAML here is :func:`fedco.problems.personalized.personalized_maml` (one task per client:
the inner map is ``w - a grad l(w; x, y)`` per image, its batch mean the adapted model on the
support batch; the outer the loss on an independent query batch; exact second order unless
``config.first_order``, which also makes FedMAML's exact step its first-order one).

**Evaluation** ("validation loss and accuracy after one personalization step"): the run's
host evaluation (``runner.Run.evaluate``: it sees the whole simulation state, Ditto's
personal models and TR-MAML's weights) at round 0, every ``eval_every`` rounds and at the
last round: each client ``k`` takes the server model, makes ONE gradient step on the mean
loss over ALL of its training images (deterministic; the rate is the method's
``problem.inner_lr``, or ``problem.finetune_lr`` for a method on the cross-entropy) and is
scored on its validation set.
Ditto's, FedRep's, FedPer's and APFL's clients are scored with their own models as they are
(:func:`fedco.algorithms.personal.personal_model`, no extra step). Reported:
mean and worst client validation accuracy, mean and worst validation loss, the same mean
accuracy/loss of the shared model without personalisation (``*_global``), the per-client
accuracies (``val_acc_clients``), and TR-MAML's client weights ``p``. The evaluation is one
jitted program (``lax.map`` over chunks of ``eval_chunk`` clients, each chunk vmapped)
shared by all methods.

Ablations (ComFedL-DAMAML, ``methods.comfedl_damaml``, only; the paper's Figs. 5-6):
``config.ablation = "local_steps"`` (1, 2, 5, 10), ``"gamma"`` (0.1, 0.5, 1, 5: the paper's
grid) or ``"rho"`` (0.1 = balanced, 0.28, 0.6, 0.8); ``config.ablation_values`` overrides.

Datasets: ``dataset = "cifar10"`` reads TFDS ``cifar10`` prepared as array_record under
``data_dir`` (see ``fedco.data.sources``); ``dataset = "digits"`` is the offline stand-in
(scikit-learn's 8x8 digits, 1347 training images): images are upsampled 2x by pixel
repetition to 16x16x1, the smallest input ``CNN4``'s four 2x2 pools accept, and
``per_client`` defaults to 120 (each class must supply ``per_client`` images: the 10
clients together take ``rho + 9 (1 - rho)/9 = 1`` client's worth of every class). The
variant config ``personalized_cifar_digits.py`` sets it with its 30 rounds::

    python -m experiments.main --config=experiments/configs/personalized_cifar_digits.py \
        --workdir=runs/e2                                                        # offline
    python -m experiments.main --config=experiments/configs/personalized_cifar.py \
        --config.data_dir=~/tensorflow_datasets --workdir=runs/e2
    python -m experiments.main --config=experiments/configs/personalized_cifar_digits.py \
        --config.ablation=rho --workdir=runs/e2_rho

Rounds: the paper gives none. The default 300 for CIFAR-10 (500 images per client: 300
rounds of 5 batches of 32 are about 100 local epochs) is meant for an accelerator; on 2 CPU
cores a round of the four MAML-type methods takes seconds each. Digits: 30 rounds
(ComFedL-MAML passes 0.95 mean validation accuracy by round 15). ``per_client = 5000``
uses the whole CIFAR-10 training split (the partition's maximum; lower ``eval_chunk``
then, since evaluation holds a chunk of clients' whole training sets).

**DA-MAML at the paper's settings diverges** on digits (ComFedL's step is ``exp((L -
shift)/gamma) / gamma``, about 200, times the MAML gradient); the measurements and what
``shift`` and ``gamma`` change are in the reproduce guide (``docs/guides/reproduce.md``,
"What E2 shows"). A diverged run stays in ``summary.json`` and the table with its note.

**CPU speed.** XLA:CPU runs convolution gradients 10-60x slower inside ``lax.scan`` (where
fedco's simulator runs every local step) than outside (jax issue #12868). ``CNN4``'s default
``conv_impl = "auto"`` therefore computes convolutions as im2col matrix products on the CPU
(and on a GPU, where they are faster too: decision 87; ``fedco.models.layers``, same
parameters and values); ``"xla"`` forces ``lax.conv_general_dilated``.

Besides the runner's outputs (one metrics row per evaluation and run; the CSV without the
per-client lists), writes ``curves.png`` (mean validation loss, mean and worst accuracy
against rounds, mean +- std over seeds) and the clients' sizes in ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

import fedco
from fedco import extend, models
from fedco.algorithms import personal as personal_lib
from fedco.data import partition, sources
from fedco.data.datasets import make_federated
from fedco.experiment import outputs, runner
from fedco.problems import personalized

DATASETS = ("cifar10", "digits")
PER_CLIENT = {"cifar10": 500, "digits": 120}
PROBLEMS = ("da_maml", "maml", "erm")
PROBLEM_FIELDS = ("name", "inner_lr", "finetune_lr")  # a method's ``problem`` fields
NUM_CLIENTS = 10
NUM_CLASSES = 10
ABLATION_DEFAULTS = {
  "local_steps": (1, 2, 5, 10),
  "gamma": (0.1, 0.5, 1.0, 5.0),
  "rho": (0.1, 0.28, 0.6, 0.8),
}
TABLE_KEYS = (
  "val_acc_avg",
  "val_acc_worst",
  "val_loss_avg",
  "val_loss_worst",
  "val_acc_global_avg",
  "val_loss_global_avg",
)
PROGRESS = "val_acc_avg"


def _check_rho(name, value) -> float:
  return extend.bounded(f"--{name}", value, 0.0, 1.0, closed_low=True, closed_high=True)


def check(config) -> None:
  """E2's own fields and methods' problems (``ValueError`` naming ``--config.<field>``)."""
  extend.one_of("--config.dataset", config.dataset, DATASETS)
  extend.positive_int("--config.per_client", config.per_client, minimum=0)
  _check_rho("config.rho", config.rho)
  for name in ("filters", "eval_chunk"):
    extend.positive_int(f"--config.{name}", config[name])
  if not isinstance(config.first_order, bool):
    raise ValueError(f"--config.first_order must be True or False, got {config.first_order!r}")
  extend.one_of("--config.conv_impl", config.conv_impl, models.layers.CONV_IMPLS)
  extend.positive("--config.gamma", config.gamma)
  extend.bounded("--config.shift", config.shift)
  compared = runner.methods(config)  # their factories check their arguments
  for m in compared:
    fields, where = m.problem.get("problem"), f"--config.methods.{m.label}"
    if not hasattr(fields, "items") or fields.get("name") not in PROBLEMS:
      raise ValueError(
        f"{where}.problem must hold a name (one of {PROBLEMS}) and its "
        f"settings {PROBLEM_FIELDS[1:]}, got {fields!r}"
      )
    unknown = sorted(set(fields) - set(PROBLEM_FIELDS))
    if unknown:
      raise ValueError(
        f"{where}.problem.{unknown[0]} is not a problem setting; allowed: {PROBLEM_FIELDS}"
      )
    if m.kwargs.get("normalized"):
      if fields["name"] != "da_maml":
        raise ValueError(
          f"{where}.normalized: fedco.comfedl(normalized=True) normalises exp(loss/gamma) "
          f"weights, which the da_maml problem has and the {fields['name']} problem does not"
        )
      if m.kwargs.get("gamma") is not None:
        raise ValueError(
          f"{where}.gamma: a normalised ComFedL-DAMAML weighs by DA-MAML's "
          f"own temperature, --config.gamma ({config.gamma}); leave it unset"
        )
    if fields["name"] != "erm":
      extend.positive(f"--config.methods.{m.label}.problem.inner_lr", fields.get("inner_lr"))
    elif m.algorithm not in personal_lib.PERSONAL:
      extend.positive(f"--config.methods.{m.label}.problem.finetune_lr", fields.get("finetune_lr"))
  values = runner.ablation(config, ABLATION_DEFAULTS)
  if values and not any(m.problem["problem"]["name"] == "da_maml" for m in compared):
    raise ValueError(
      "--config.ablation needs a method with problem 'da_maml' in "
      "--config.methods (the ablated ComFedL-DAMAML)"
    )
  for v in values if config.ablation == "rho" else ():
    _check_rho("config.ablation_values", v)


def per_client(config) -> int:
  """Training images per client: ``config.per_client``, or the data set's default."""
  return config.per_client or PER_CLIENT[config.dataset]


def methods(config, setup=None) -> List[runner.Method]:
  """The config's methods, each with its ``problem`` settings (DA-MAML's with ``gamma`` and
  ``shift``) and ``rho``; or, under ``config.ablation``, the first DA-MAML method once per
  value (a normalised ComFedL records ``config.gamma`` as its weights' temperature)."""
  del setup
  out = []
  for m in runner.methods(config):
    fields = dict(m.problem["problem"])
    if fields["name"] == "da_maml":
      fields.update(gamma=float(config.gamma), shift=float(config.shift))
    kwargs = {**m.kwargs, "gamma": float(config.gamma)} if m.kwargs.get("normalized") else m.kwargs
    out.append(
      dataclasses.replace(m, kwargs=kwargs, problem={"problem": fields, "rho": float(config.rho)})
    )
  values = runner.ablation(config, ABLATION_DEFAULTS)
  if not values:
    return out
  base = next(m for m in out if m.problem["problem"]["name"] == "da_maml")
  if config.ablation == "gamma":  # DA-MAML's temperature, in the problem's settings
    return [
      base.variant(
        f"{base.label}_gamma={v:g}",
        problem={**base.problem, "problem": {**base.problem["problem"], "gamma": v}},
      )
      for v in values
    ]
  return runner.ablated(config, base, values, problem_keys=("rho",))


# ---- data --------------------------------------------------------------------------------


def load_splits(config):
  """Train and test arrays with images ``[N, H, W, C]`` (digits upsampled to 16x16x1)."""
  try:
    splits = fedco.data.load(config.dataset, config.data_dir or None)
  except FileNotFoundError:
    raise FileNotFoundError(
      f"TFDS {config.dataset} is not prepared as array_record under --config.data_dir="
      f"{config.data_dir or '(TFDS default)'} (prepare it once: tfds build "
      f"{config.dataset} --file_format=array_record; see fedco.data.sources); to run "
      "offline use --config.dataset=digits"
    ) from None
  if config.dataset != "digits":
    return splits

  def up(split):  # 8x8 -> 16x16 by pixel repetition: CNN4 needs H, W >= 16
    x = split["x"].reshape(-1, 8, 8, 1).repeat(2, axis=1).repeat(2, axis=2)
    return {"x": np.ascontiguousarray(x), "y": split["y"]}

  return type(splits)(up(splits.train), up(splits.test))


def build_data(splits, config, rho: float, seed: int):
  """The dominant-class split of SPEC E2 with matched validation sets from the test split."""
  train, test = splits
  try:
    parts = partition.dominant_class(
      train["y"], NUM_CLIENTS, rho, per_client(config), seed, num_classes=NUM_CLASSES
    )
  except ValueError as err:
    raise ValueError(f"--config.per_client: {err}") from None
  val_parts = partition.matched_validation(parts, train["y"], test["y"], seed)
  return make_federated(
    train,
    test,
    parts,
    val_parts,
    config.dataset,
    NUM_CLASSES,
    info={
      "partition": "dominant_class",
      "rho": rho,
      "per_client": per_client(config),
      "seed": seed,
    },
  )


@dataclasses.dataclass(frozen=True)
class Shared:
  """What every run shares (``setup``'s result).

  Attributes:
    splits: the train and test splits (:func:`load_splits`).
    model: the CNN.
    apply_fn: the CNN's apply function.
    evaluator: the jitted evaluation of :func:`make_evaluator`.
    sizes: ``{seed: {"train", "val": client sizes}}``, filled in by :func:`prepare`.
  """

  splits: sources.Splits
  model: models.CNN4
  apply_fn: Callable
  evaluator: Callable
  # a dict that prepare() fills in (each seed's sizes), for summarize() to report
  sizes: Dict[int, Dict[str, List[int]]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PerSeed:
  """What one seed's runs share (``prepare``'s result).

  Attributes:
    apply_fn: the CNN's apply function (``setup``'s).
    evaluator: the jitted evaluation (``setup``'s).
    data: ``{rho: the seed's clients}`` for every ``rho`` the runs take.
    params: the seed's initial model.
  """

  apply_fn: Callable
  evaluator: Callable
  data: Dict[float, fedco.data.FederatedDataset]
  params: Any


def setup(config) -> Shared:
  """The data (loaded once), the model and its evaluator; ``sizes`` collects each seed's
  client sizes."""
  model, apply_fn, evaluator = _model(config.filters, config.conv_impl, config.eval_chunk)
  return Shared(load_splits(config), model, apply_fn, evaluator)


def prepare(config, seed, setup) -> PerSeed:
  """The seed's clients for every ``rho`` run (the first one's sizes recorded) and its
  initial model."""
  rhos = (
    runner.ablation(config, ABLATION_DEFAULTS) if config.ablation == "rho" else (float(config.rho),)
  )
  data = {rho: build_data(setup.splits, config, rho, seed) for rho in rhos}
  setup.sizes[seed] = {
    "train": data[rhos[0]].train_sizes().tolist(),
    "val": data[rhos[0]].val_sizes().tolist(),
  }
  shape = tuple(setup.splits.train["x"].shape[1:])
  params = models.init_cnn(setup.model, shape, seed)
  return PerSeed(apply_fn=setup.apply_fn, evaluator=setup.evaluator, data=data, params=params)


def build(config, method, seed, prepared) -> runner.Run:
  """One run: its problem, the algorithm, and the evaluation after one personalisation step
  of the problem's ``inner_lr`` (``finetune_lr`` on the cross-entropy; Ditto's personal
  models as they are, and FedRep's, FedPer's and APFL's)."""
  del seed
  apply_fn, fed = prepared.apply_fn, prepared.data[method.problem["rho"]]
  fields, loss = method.problem["problem"], models.cross_entropy
  # a normalised ComFedL's weights' temperature is the run's DA-MAML gamma
  algorithm = method.build(
    **({"gamma": fields["gamma"]} if method.kwargs.get("normalized") else {})
  )
  if fields["name"] == "erm":
    problem = fedco.plain(personalized.example_loss(apply_fn, loss), name="cross_entropy")
    eval_lr = None if method.algorithm in personal_lib.PERSONAL else fields["finetune_lr"]
  else:
    problem = personalized.personalized_maml(
      apply_fn,
      fields["inner_lr"],
      loss,
      first_order=config.first_order,
      gamma=fields.get("gamma"),
      shift=fields.get("shift", 0.0),
    )
    eval_lr = fields["inner_lr"]
  lr = jnp.float32(0.0 if eval_lr is None else eval_lr)

  own_models = jax.jit(functools.partial(personal_lib.personal_models, algorithm))

  def evaluate(state):
    personal = own_models(state.server["params"], state.clients) if eval_lr is None else None
    row = evaluation_row(
      *jax.device_get(prepared.evaluator(state.server["params"], personal, lr, fed.train, fed.val))
    )
    if method.algorithm == "tr_maml":
      row["client_weights"] = np.asarray(state.server_opt_state.p)
    return row

  return runner.Run(problem, algorithm, fed.train, prepared.params, evaluate=evaluate)


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


def evaluation_row(val_loss, val_acc, val_loss_global, val_acc_global) -> Dict[str, Any]:
  """One evaluation's row from the per-client values ``[K]``."""
  return {
    "val_acc_avg": np.mean(val_acc),
    "val_acc_worst": np.min(val_acc),
    "val_loss_avg": np.mean(val_loss),
    "val_loss_worst": np.max(val_loss),
    "val_acc_global_avg": np.mean(val_acc_global),
    "val_loss_global_avg": np.mean(val_loss_global),
    "val_acc_clients": np.asarray(val_acc),
  }


def summarize(config, outcome) -> Dict[str, Any]:
  return {
    "dataset": sources.describe(config.dataset, config.data_dir),
    "rounds": config.rounds,
    "local_steps": config.local_steps,
    "rho": config.rho,
    "per_client": per_client(config),
    "ablation": config.ablation,
    "ablation_values": list(runner.ablation(config, ABLATION_DEFAULTS)),
    "client_sizes": outcome.setup.sizes,
  }


def plot(wd, config, outcome):
  """``curves.png`` (see :func:`figure`)."""
  wd.save_figure(figure(outcome.records, config, outcome.labels), "curves.png")


def figure(records, config, labels):
  """Mean validation loss, mean and worst-client validation accuracy after personalisation
  against rounds."""
  setting = "" if config.ablation == "rho" else f" (rho={config.rho:g})"
  panels = (
    ("val_loss_avg", "validation loss (mean over clients)"),
    ("val_acc_avg", "validation accuracy (mean over clients)"),
    ("val_acc_worst", "validation accuracy (worst client)"),
  )
  fig = outputs.curves(records, labels, panels, title=f"{config.dataset}{setting}")
  fig.suptitle(
    f"{sources.describe(config.dataset, config.data_dir)}: after one personalisation step "
    "from the server model (Ditto, FedRep, FedPer, APFL: their own models); mean +- std over "
    "seeds",
    fontsize=9,
  )
  return fig
