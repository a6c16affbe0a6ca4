r"""E4: federated few-shot Omniglot (paper 003, Sec. 5.2).

One client per training alphabet (Vinyals split: 33 train / 5 validation / 12 test
alphabets, see :mod:`fedco.data.omniglot`); ``ways``-way ``shots``-shot tasks drawn within
the client's alphabet with ``query = 15`` query images per class; rotations by multiples of
90 degrees are new classes (``rotations``). Model: MAML's Omniglot CNN
(``fedco.models.OmniglotCNN``: four blocks of ``filters = 64`` 3x3 filters, batch
normalisation with the task's own statistics, ReLU, 2x2 max-pool); MAML ``inner_lr = 0.4``,
``inner_steps = 1`` second-order step (``first_order = False``). The compared methods are
``config.methods``, with paper 003's 5-way 1-shot settings:

* ``local_scgdm`` (Local-SCGDM): ``learning_rate`` (eta) 1, ``beta = 0.1``, ``alpha = 0.9``,
  ``gamma = 0.99``;
* ``comfedl`` (Local-BSGD = ComFedL-MAML): ``learning_rate = 0.1``;
* ``local_scgd`` (Local-SCGD): ``learning_rate = 0.1``, ``gamma = 0.99``.

(Local-MOML is left out, as in the paper: it keeps a memory per task.) Paper 003 does not
give the local period, the meta-batch, the number of iterations or the test protocol; the
defaults here are ``local_steps = 5`` (its sinusoid setting), one task per client per step
(``tasks_per_episode = 1``: 33 tasks per meta-iteration, about MAML's 32), 1000 rounds, and
evaluation with the training inner step (``eval_inner_steps = 1``). Every run has the same
``rounds * local_steps`` meta-iterations: a method with its own ``local_steps`` runs
``rounds * local_steps / its local_steps`` rounds and evaluates at the same meta-iterations
(``eval_every`` is in rounds at the shared ``local_steps``).

Problem layout: an example is an episode of ``tasks_per_episode`` independent random tasks
(a meta-batch); each step draws one episode per client (``batch_size = 1``) and uses it for
both the inner map (support sets) and the outer (its own query sets), which is
``simulate(..., paired_batches=True)``. The model sees a task's images together (batch
statistics), so the MAML task loss applies it to the whole set (:class:`TaskMAML`) instead of
vmapping over single images.

Reported per evaluation (the meta-iteration is ``round * local_steps``): ``train_loss`` /
``train_acc`` (query cross-entropy and accuracy after adaptation on the first pre-drawn
episode of every client: ``K * T`` training tasks) and ``val_loss`` / ``val_acc`` (the same
on ``val_tasks`` fresh tasks of the validation alphabets; one set for every seed and method,
so comparisons are paired). Final values are those of the last evaluated round;
``test_acc`` is the final model's accuracy on ``test_tasks`` tasks of the test alphabets.
Adaptation at evaluation uses ``eval_inner_steps`` steps.

    python -m experiments.main --config=experiments/configs/omniglot.py \
        --config.data_dir=~/tensorflow_datasets --workdir=runs/e4
    python -m experiments.main --config=experiments/configs/omniglot.py --config.shots=5 \
        --workdir=runs/e4_5w5s
    python -m experiments.main --config=experiments/configs/omniglot.py --config.ways=20 \
        --workdir=runs/e4_20w1s

Reads the upstream zips when ``data_dir`` holds them
(``--config.data_dir=../shared/data/omniglot``: :func:`fedco.data.load_omniglot_zips`),
else TFDS ``omniglot`` prepared as ``array_record`` (``tfds build omniglot
--file_format=array_record``, once, with TensorFlow and network; see
:mod:`fedco.data.sources`) under ``data_dir``. Besides the runner's outputs, the summary
holds the alphabets of each part, ``local_scgdm_val_acc_above_<label>`` per seed;
``curves.png`` draws the training loss and validation accuracy after
adaptation against meta-iterations, mean +- std over seeds.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

import fedco
from fedco import extend
from fedco.data import omniglot as omniglot_data
from fedco.experiment import outputs, runner
from fedco.models import OmniglotCNN, cross_entropy, init_cnn
from fedco.problems.maml import MAML

EVAL_SEED = 12345  # one validation / test task set for every seed and method
DRAWINGS = 20  # drawings per Omniglot character
SPLIT_SEED = 0  # the "random" alphabet split does not change with config.seeds
RECORD_KEYS = ("train_loss", "train_acc", "val_loss", "val_acc")
TABLE_KEYS = ("val_acc", "train_loss", "train_acc", "val_loss")  # and test_acc with test tasks
PROGRESS = "val_acc"
SEEDS_IN_ONE_PROGRAM = True  # its seeds differ only in data, model and metrics_data


def check(config) -> None:
  """E4's own fields (``ValueError`` naming ``--config.<field>``)."""
  if config.batch_size != 1:
    raise ValueError(
      f"--config.batch_size must be 1 (one episode per client and step: its "
      f"support sets feed the inner map, its query sets the outer; the "
      f"meta-batch is config.tasks_per_episode), got {config.batch_size!r}"
    )
  extend.positive_int("--config.ways", config.ways, minimum=2)
  for name in (
    "shots",
    "query",
    "tasks_per_episode",
    "inner_steps",
    "filters",
    "episodes_per_client",
    "val_tasks",
    "eval_chunk",
  ):
    extend.positive_int(f"--config.{name}", config[name])
  extend.positive_int("--config.eval_inner_steps", config.eval_inner_steps, minimum=0)
  extend.positive_int("--config.client_chunk", config.client_chunk, minimum=0)
  extend.positive_int("--config.test_tasks", config.test_tasks, minimum=0)
  if config.shots + config.query > DRAWINGS:
    raise ValueError(
      f"--config.shots + --config.query must be at most {DRAWINGS} (the "
      f"drawings of an Omniglot character), got shots={config.shots}, "
      f"query={config.query}"
    )
  extend.positive("--config.inner_lr", config.inner_lr)
  for name in ("first_order", "rotations"):
    if not isinstance(config[name], bool):
      raise ValueError(f"--config.{name} must be True or False, got {config[name]!r}")
  extend.one_of("--config.alphabet_split", config.alphabet_split, omniglot_data.SPLITS)
  sizes = outputs.check_int_list("--config.split_sizes", config.split_sizes, 0)
  if len(sizes) != 3 or min(sizes[:2]) < 1:
    raise ValueError(
      f"--config.split_sizes must be three integers train >= 1, val >= 1, "
      f"test >= 0, got {config.split_sizes!r}"
    )
  if config.alphabet_split == "vinyals" and sizes != omniglot_data.VINYALS_SIZES:
    raise ValueError(
      f"--config.split_sizes: the vinyals split is "
      f"{omniglot_data.VINYALS_SIZES}; use --config.alphabet_split=random for "
      f"{sizes}"
    )


@dataclasses.dataclass(frozen=True, eq=False)
class TaskMAML(MAML):
  """MAML whose model sees a task's points together: ``apply_fn(params, x[n, ...])``.

  :class:`fedco.problems.maml.MAML` vmaps ``apply_fn`` over single points; a network with
  batch statistics (MAML's Omniglot CNN) must see the task's support (or query) set as one
  batch, so the task loss applies it once to the whole set. Everything else (the episode
  layout, the exact second-order inner VJP, ``adapt``) is inherited.
  """

  def task_loss(self, params, x, y) -> jax.Array:
    return jnp.mean(jax.vmap(self.loss)(self.apply_fn(params, x), y))

  def task_metrics(self, params, support_x, support_y, query_x, query_y, steps: int):
    """Query ``(loss, accuracy)`` of one task after ``steps`` first-order adaptation steps
    (values equal the second-order ones)."""
    adapted = self.adapt(params, support_x, support_y, steps=steps, first_order=True)
    logits = self.apply_fn(adapted, query_x)
    loss = jnp.mean(jax.vmap(self.loss)(logits, query_y))
    return loss, jnp.mean((jnp.argmax(logits, -1) == query_y).astype(jnp.float32))


def make_model(config):
  """The CNN and the MAML problem's helper (``TaskMAML``) of a config."""
  model = OmniglotCNN(num_classes=config.ways, filters=config.filters)

  def apply_fn(params, x):  # uint8 images (255 = stroke) -> float in [0, 1]
    return model.apply(params, jnp.asarray(x, jnp.float32) * (1.0 / 255.0))

  meta = TaskMAML(
    apply_fn, config.inner_lr, config.inner_steps, config.first_order, loss=cross_entropy
  )
  return model, meta


def chunked(sets, chunk: int) -> Dict[str, np.ndarray]:
  """Evaluation sets (a list of episodes, each ``[n_i, ...]`` per task array) as one array
  ``[chunks, chunk, ...]`` per field, plus ``group [chunks, chunk]`` (the set's index, ``-1``
  on padding). Each set is padded to a multiple of ``chunk`` with repeats of its tasks."""
  fields = ("support_x", "support_y", "query_x", "query_y")
  parts = {k: [] for k in fields + ("group",)}
  for i, episode in enumerate(sets):
    n = episode["support_x"].shape[0]
    total = -(-n // chunk) * chunk
    take = np.arange(total) % n
    for k in fields:
      parts[k].append(np.asarray(episode[k])[take])
    parts["group"].append(np.where(np.arange(total) < n, i, -1).astype(np.int32))
  return {k: np.concatenate(v).reshape((-1, chunk) + np.shape(v[0])[1:]) for k, v in parts.items()}


def evaluate(meta, params, chunks, steps: int, groups: int) -> Dict[str, jax.Array]:
  """Mean query loss and accuracy ``[groups]`` of each evaluation set (``lax.map`` over
  chunks, ``vmap`` over a chunk's tasks; one compiled body for every set)."""

  def one_chunk(c):
    return jax.vmap(lambda sx, sy, qx, qy: meta.task_metrics(params, sx, sy, qx, qy, steps))(
      c["support_x"], c["support_y"], c["query_x"], c["query_y"]
    )

  loss, acc = jax.lax.map(one_chunk, {k: v for k, v in chunks.items() if k != "group"})
  onehot = (chunks["group"].reshape(-1)[:, None] == jnp.arange(groups)).astype(jnp.float32)
  n = jnp.sum(onehot, 0)
  return {"loss": loss.reshape(-1) @ onehot / n, "acc": acc.reshape(-1) @ onehot / n}


def _chunk_size(config, *sizes) -> int:
  return max(1, min(config.eval_chunk, max(sizes)))


def methods(config, setup) -> List[runner.Method]:
  """The config's methods, each with the ``rounds`` and ``eval_every`` of the shared
  meta-iterations among its settings."""
  del setup
  return [
    dataclasses.replace(m, problem={**m.problem, **runner.same_iterations(config, m)})
    for m in runner.methods(config)
  ]


def load(config) -> omniglot_data.OmniglotData:
  """Omniglot from ``--config.data_dir``: the upstream zips where the folder holds
  ``images_background.zip`` (``../shared/data/omniglot``), else TFDS ``omniglot`` prepared
  as array_record (``FileNotFoundError`` saying how to prepare it)."""
  folder = os.path.expanduser(config.data_dir) if config.data_dir else ""
  if folder and os.path.isfile(os.path.join(folder, "images_background.zip")):
    return omniglot_data.load_omniglot_zips(folder)
  try:
    return omniglot_data.load_omniglot(config.data_dir or None)
  except FileNotFoundError:
    raise FileNotFoundError(
      f"TFDS omniglot is not prepared as array_record under --config.data_dir="
      f"{config.data_dir or '(TFDS default)'} (prepare it once: tfds build omniglot "
      "--file_format=array_record; see fedco.data.sources), and the folder holds no "
      "upstream images_background.zip / images_evaluation.zip"
    ) from None


@dataclasses.dataclass(frozen=True)
class Shared:
  """What every run shares (``setup``'s result).

  Attributes:
    data: the Omniglot arrays.
    split: the alphabet split (train, val, test alphabets).
    val: the validation tasks (one episode, the same for every seed and method).
    test: ``test(params) -> accuracy`` on the test tasks, or ``None`` without test tasks.
    model: the CNN.
    meta: the MAML problem's helper (:class:`TaskMAML`).
    problem: the MAML problem.
  """

  data: omniglot_data.OmniglotData
  split: omniglot_data.AlphabetSplit
  val: Dict[str, Any]
  test: Optional[Callable[[Any], float]]
  model: OmniglotCNN
  meta: TaskMAML
  problem: fedco.Problem


@dataclasses.dataclass(frozen=True)
class PerSeed:
  """What one seed's runs share (``prepare``'s result): ``fedco.simulate``'s arguments.

  Attributes:
    problem: the MAML problem (``setup``'s).
    data: the seed's client episodes.
    params: the seed's initial model.
    metrics_fn: ``metrics_fn(params, chunks)``: loss and accuracy after adaptation on the
      training and validation tasks.
    metrics_data: ``metrics_fn``'s tasks (:func:`chunked`).
  """

  problem: fedco.Problem
  data: fedco.FederatedData
  params: Any
  metrics_fn: Callable
  metrics_data: Dict[str, Any]


def setup(config) -> Shared:
  """The Omniglot arrays and alphabet split (``FileNotFoundError`` when missing), the
  validation and test tasks (one set for every run), the model and the MAML problem."""
  data = load(config)
  split = omniglot_data.split_alphabets(
    data, config.alphabet_split, seed=SPLIT_SEED, sizes=tuple(int(s) for s in config.split_sizes)
  )
  val = omniglot_data.evaluation_episode(
    data, split.val, EVAL_SEED, stream=1, num_tasks=config.val_tasks, **_tasks(config)
  )
  model, meta = make_model(config)
  problem = meta.problem("omniglot_maml")
  test = None
  if config.test_tasks and split.test:
    episode = omniglot_data.evaluation_episode(
      data, split.test, EVAL_SEED, stream=2, num_tasks=config.test_tasks, **_tasks(config)
    )
    chunks = jax.tree.map(jnp.asarray, chunked([episode], _chunk_size(config, config.test_tasks)))
    test_eval = jax.jit(lambda p, c: evaluate(meta, p, c, config.eval_inner_steps, 1))
    test = lambda params: float(test_eval(params, chunks)["acc"][0])
  return Shared(data, split, val, test, model, meta, problem)


def _tasks(config):
  return {
    "ways": config.ways,
    "shots": config.shots,
    "query": config.query,
    "rotations": config.rotations,
  }


def prepare(config, seed, setup) -> PerSeed:
  """A seed's client episodes, initial model and metrics (``fedco.simulate``'s arguments):
  the training metrics on the first pre-drawn episode of every client."""
  fed = omniglot_data.federated(
    setup.data,
    setup.split.train,
    seed,
    tasks_per_episode=config.tasks_per_episode,
    episodes_per_client=config.episodes_per_client,
    **_tasks(config),
  )
  first = np.asarray(fed.flat_rows)[np.asarray(fed.offsets)]  # each client's first episode
  train = {
    k: np.asarray(v)[first].reshape((-1,) + np.shape(v)[2:])
    for k, v in fed.examples.items()
    if k != "task_weight"
  }
  sizes = (train["support_x"].shape[0], config.val_tasks)
  chunks = jax.tree.map(jnp.asarray, chunked([train, setup.val], _chunk_size(config, *sizes)))
  meta = setup.meta

  def metrics_fn(w, chunks):  # the tasks are an argument: every seed's run is one program
    out = evaluate(meta, w, chunks, config.eval_inner_steps, 2)  # 0: training, 1: validation
    return {
      "train_loss": out["loss"][0],
      "train_acc": out["acc"][0],
      "val_loss": out["loss"][1],
      "val_acc": out["acc"][1],
    }

  shape = (omniglot_data.IMAGE_SIZE, omniglot_data.IMAGE_SIZE, 1)
  return PerSeed(
    problem=setup.problem,
    data=fed,
    metrics_fn=metrics_fn,
    metrics_data=chunks,
    params=init_cnn(setup.model, shape, seed),
  )


def build(config, method, seed, prepared) -> runner.Run:
  del seed
  simulate = {"paired_batches": True, "evaluate": False}
  if config.client_chunk:  # at most every training client at once
    simulate["client_chunk"] = min(config.client_chunk, prepared.data.num_clients)
  return runner.Run(
    prepared.problem,
    method.build(),
    prepared.data,
    prepared.params,
    metrics_fn=prepared.metrics_fn,
    metrics_data=prepared.metrics_data,
    record_keys=RECORD_KEYS,
    simulate=simulate,
    **runner.same_iterations(config, method),
  )


def finish(config, method, seed, result, final):
  del config, seed, result
  final["iteration"] = final["round"] * method.local_steps


def summarize(config, outcome) -> Dict[str, Any]:
  """``test_acc`` of every final model (a table column when there are test tasks), the
  setting, the alphabets and ``local_scgdm_val_acc_above_<label>`` per seed."""
  s, finals = outcome.setup, outcome.finals
  if s.test is not None:
    for (label, seed), result in outcome.results.items():
      finals[label][seed]["test_acc"] = s.test(result.params)
    outcome.per_method, outcome.table = outputs.seed_statistics(finals, TABLE_KEYS + ("test_acc",))
  summary = {
    "setting": f"{config.ways}-way {config.shots}-shot",
    "rounds": config.rounds,
    "local_steps": config.local_steps,
    "iterations": config.rounds * config.local_steps,
  }
  if "local_scgdm" in finals:
    val = lambda label, seed: finals[label].get(seed, {}).get("val_acc", float("nan"))
    for other in finals:
      if other != "local_scgdm":
        summary[f"local_scgdm_val_acc_above_{other}"] = {
          seed: val("local_scgdm", seed) > val(other, seed) for seed in outcome.seeds
        }
  summary["alphabets"] = {
    part: [s.data.alphabet_names[a] for a in getattr(s.split, part)]
    for part in ("train", "val", "test")
  }
  return summary


def plot(wd, config, outcome):
  """``curves.png`` (see :func:`figure`)."""
  steps = {m.label: m.local_steps for m in outcome.methods}
  wd.save_figure(figure(outcome.records, config, outcome.labels, steps), "curves.png")


def figure(records, config, labels, steps=None):
  """Training loss and validation accuracy after adaptation against meta-iterations
  (``steps``: each method's local steps; default ``config.local_steps``)."""
  panels = (
    ("train_loss", "query cross-entropy on training tasks"),
    ("val_acc", "query accuracy on validation tasks"),
  )
  return outputs.curves(
    records,
    labels,
    panels,
    title=f"Omniglot {config.ways}-way {config.shots}-shot, after adaptation",
    x="meta-iteration (round x local_steps)",
    steps=steps or {label: config.local_steps for label in labels},
  )
