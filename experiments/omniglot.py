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

Reported per evaluation (streamed to ``metrics.jsonl`` / ``metrics.csv`` while runs go, one
row per ``method``, ``seed`` and evaluated ``round``; the meta-iteration is ``round *
local_steps``): ``train_loss`` / ``train_acc`` (query cross-entropy and accuracy after
adaptation on the first pre-drawn episode of every client: ``K * T`` training tasks) and
``val_loss`` / ``val_acc`` (the same on ``val_tasks`` fresh tasks of the validation
alphabets; one set for every seed and method, so comparisons are paired). Final values are
those of the last evaluated round; ``test_acc`` is the final model's accuracy on
``test_tasks`` tasks of the test alphabets. Adaptation at evaluation uses
``eval_inner_steps`` steps.

    python -m experiments.main --config=experiments/configs/omniglot.py \
        --config.data_dir=~/tensorflow_datasets --workdir=runs/e4
    python -m experiments.main --config=experiments/configs/omniglot.py --config.shots=5 \
        --workdir=runs/e4_5w5s
    python -m experiments.main --config=experiments/configs/omniglot.py --config.ways=20 \
        --workdir=runs/e4_20w1s

Needs TFDS ``omniglot`` prepared as ``array_record`` (``tfds build omniglot
--file_format=array_record``, once, with TensorFlow and network; see
:mod:`fedco.data.sources`) under ``data_dir``. Writes ``config.json``, ``metrics.jsonl``,
``metrics.csv``, ``summary.json`` (the alphabets of each part, final validation and test
accuracy per method and seed, mean +- std over seeds, ``local_scgdm_val_acc_above_<label>``
per seed) and ``curves.png`` (training loss and validation accuracy after adaptation
against meta-iterations, mean +- std over seeds), prints the final table, and checkpoints
every run under ``checkpoints/`` (rerunning resumes; the driver's ``--noresume`` starts
over).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np

from experiments import common, runner
from fedco.data import omniglot as omniglot_data
from fedco.models import OmniglotCNN, cross_entropy, init_cnn
from fedco.problems.maml import MAML

EVAL_SEED = 12345    # one validation / test task set for every seed and method
DRAWINGS = 20        # drawings per Omniglot character
SPLIT_SEED = 0       # the "random" alphabet split does not change with config.seeds
RECORD_KEYS = ("train_loss", "train_acc", "val_loss", "val_acc")
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "v", "D", "x")


def _build(method: runner.Method):
  """``method.build()``; the factory's ``ValueError`` names the method's field."""
  try:
    return method.build()
  except ValueError as err:
    arg = (str(err).split() or [""])[0]
    field = arg if arg in (*method.kwargs, "learning_rate") else ""
    raise ValueError(f"--config.methods.{method.label}{'.' + field if field else ''} is "
                     f"invalid for fedco.{method.algorithm}: {err}") from None


def check(config) -> Dict[str, Any]:
  """The checked settings (``ValueError`` naming ``--config.<field>``); runs nothing."""
  settings = runner.check_shared(config)
  if config.batch_size != 1:
    raise ValueError(f"--config.batch_size must be 1 (one episode per client and step: its "
                     f"support sets feed the inner map, its query sets the outer; the "
                     f"meta-batch is config.tasks_per_episode), got {config.batch_size!r}")
  if not isinstance(config.data_dir, str):
    raise ValueError(f"--config.data_dir must be a folder path ('' for TFDS's default), got "
                     f"{config.data_dir!r}")
  common.check_int("config.ways", config.ways, 2)
  for name in ("shots", "query", "tasks_per_episode", "inner_steps", "filters",
               "episodes_per_client", "val_tasks", "eval_chunk"):
    common.check_int(f"config.{name}", config[name], 1)
  common.check_int("config.eval_inner_steps", config.eval_inner_steps, 0)
  common.check_int("config.test_tasks", config.test_tasks, 0)
  if config.shots + config.query > DRAWINGS:
    raise ValueError(f"--config.shots + --config.query must be at most {DRAWINGS} (the "
                     f"drawings of an Omniglot character), got shots={config.shots}, "
                     f"query={config.query}")
  common.check_positive("config.inner_lr", config.inner_lr)
  for name in ("first_order", "rotations"):
    if not isinstance(config[name], bool):
      raise ValueError(f"--config.{name} must be True or False, got {config[name]!r}")
  if config.alphabet_split not in omniglot_data.SPLITS:
    raise ValueError(f"--config.alphabet_split must be one of {omniglot_data.SPLITS}, got "
                     f"{config.alphabet_split!r}")
  try:
    sizes = tuple(int(s) for s in config.split_sizes)
  except (TypeError, ValueError):
    raise ValueError(f"--config.split_sizes must be three integers (train, val, test), got "
                     f"{config.split_sizes!r}") from None
  if len(sizes) != 3 or sizes[0] < 1 or sizes[1] < 1 or sizes[2] < 0:
    raise ValueError(f"--config.split_sizes must be three integers train >= 1, val >= 1, "
                     f"test >= 0, got {config.split_sizes!r}")
  if config.alphabet_split == "vinyals" and sizes != omniglot_data.VINYALS_SIZES:
    raise ValueError(f"--config.split_sizes: the vinyals split is "
                     f"{omniglot_data.VINYALS_SIZES}; use --config.alphabet_split=random for "
                     f"{sizes}")
  iterations = settings["rounds"] * settings["local_steps"]
  methods = runner.methods(config)
  for m in methods:
    _build(m)
    if iterations % m.local_steps:
      raise ValueError(f"--config.methods.{m.label}.local_steps must divide the {iterations} "
                       f"meta-iterations (config.rounds * config.local_steps), got "
                       f"{m.local_steps}")
  return {**settings, "methods": methods, "split_sizes": sizes, "iterations": iterations}


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

  meta = TaskMAML(apply_fn, config.inner_lr, config.inner_steps, config.first_order,
                  loss=cross_entropy)
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
  return {k: np.concatenate(v).reshape((-1, chunk) + np.shape(v[0])[1:])
          for k, v in parts.items()}


def evaluate(meta, params, chunks, steps: int, groups: int) -> Dict[str, jax.Array]:
  """Mean query loss and accuracy ``[groups]`` of each evaluation set (``lax.map`` over
  chunks, ``vmap`` over a chunk's tasks; one compiled body for every set)."""

  def one_chunk(c):
    return jax.vmap(lambda sx, sy, qx, qy: meta.task_metrics(params, sx, sy, qx, qy, steps))(
        c["support_x"], c["support_y"], c["query_x"], c["query_y"])

  loss, acc = jax.lax.map(one_chunk, {k: v for k, v in chunks.items() if k != "group"})
  onehot = (chunks["group"].reshape(-1)[:, None] == jnp.arange(groups)).astype(jnp.float32)
  n = jnp.sum(onehot, 0)
  return {"loss": loss.reshape(-1) @ onehot / n, "acc": acc.reshape(-1) @ onehot / n}


def _chunk_size(config, *sizes) -> int:
  return max(1, min(config.eval_chunk, max(sizes)))


def schedule(method: runner.Method, settings) -> Dict[str, int]:
  """A method's rounds and eval_every: the shared meta-iterations and evaluation points."""
  rounds = settings["iterations"] // method.local_steps
  every = settings["eval_every"] * settings["local_steps"] // method.local_steps
  return {"rounds": rounds, "eval_every": max(1, min(every, rounds))}


def load_data(config, sizes):
  """The Omniglot arrays and the alphabet split (``FileNotFoundError`` when missing)."""
  try:
    data = omniglot_data.load_omniglot(config.data_dir or None)
  except FileNotFoundError:
    raise FileNotFoundError(
        f"TFDS omniglot is not prepared as array_record under --config.data_dir="
        f"{config.data_dir or '(TFDS default)'} (prepare it once: tfds build omniglot "
        "--file_format=array_record; see fedco.data.sources)") from None
  split = omniglot_data.split_alphabets(data, config.alphabet_split, sizes=sizes,
                                        seed=SPLIT_SEED)
  return data, split


def _task_kwargs(config):
  return {"ways": config.ways, "shots": config.shots, "query": config.query,
          "rotations": config.rotations}


def run(config, workdir, options: runner.Options = runner.Options()) -> Dict[str, Any]:
  """Runs E4 and writes the outputs; returns the summary."""
  start = time.perf_counter()
  settings = check(config)
  data, split = load_data(config, settings["split_sizes"])
  task = _task_kwargs(config)
  val = omniglot_data.evaluation_episode(data, split.val, EVAL_SEED,
                                         num_tasks=config.val_tasks, stream=1, **task)
  test = None
  if config.test_tasks and split.test:
    test = omniglot_data.evaluation_episode(data, split.test, EVAL_SEED,
                                            num_tasks=config.test_tasks, stream=2, **task)
  wd = common.Workdir(workdir)
  wd.write_config(config.to_dict())
  common.start_checkpoints(wd, {"resume": options.resume})
  writers = runner.Writers(wd)
  model, meta = make_model(config)
  problem = meta.problem("omniglot_maml")
  steps = config.eval_inner_steps
  test_eval = None
  if test is not None:
    test_eval = jax.jit(lambda p, c: evaluate(meta, p, c, steps, 1))
    test_chunks = jax.tree.map(jnp.asarray, chunked([test], _chunk_size(config,
                                                                         config.test_tasks)))
  # every setting that shapes a run (data_dir is a location, not a setting)
  shared = {k: config[k] for k in ("batch_size", "ways", "shots", "query",
                                   "tasks_per_episode", "inner_lr", "inner_steps",
                                   "eval_inner_steps", "first_order", "filters",
                                   "alphabet_split", "rotations", "episodes_per_client",
                                   "val_tasks", "eval_chunk")}
  shared["split_sizes"] = list(settings["split_sizes"])
  records, finals = [], {}
  for seed in settings["seeds"]:
    fed = omniglot_data.federated(data, split.train, seed,
                                  tasks_per_episode=config.tasks_per_episode,
                                  episodes_per_client=config.episodes_per_client, **task)
    first = np.asarray(fed.flat_rows)[np.asarray(fed.offsets)]  # each client's first episode
    train_eval = {k: np.asarray(v)[first].reshape((-1,) + np.shape(v)[2:])
                  for k, v in fed.examples.items() if k != "task_weight"}
    sizes = (train_eval["support_x"].shape[0], config.val_tasks)
    eval_chunks = jax.tree.map(jnp.asarray, chunked([train_eval, val],
                                                    _chunk_size(config, *sizes)))
    params = init_cnn(model, (omniglot_data.IMAGE_SIZE, omniglot_data.IMAGE_SIZE, 1), seed)

    def metrics_fn(w, eval_chunks=eval_chunks):
      out = evaluate(meta, w, eval_chunks, steps, 2)  # set 0: training tasks, 1: validation
      return {"train_loss": out["loss"][0], "train_acc": out["acc"][0],
              "val_loss": out["loss"][1], "val_acc": out["acc"][1]}

    for method in settings["methods"]:
      plan = schedule(method, settings)
      run_records = []
      result = runner.simulate_method(
          method, seed, problem=problem, algorithm=method.build(), data=fed, params=params,
          wd=wd, options=options, writers=writers, settings={**shared, **plan},
          finals=finals, records=run_records, progress_metric="val_acc",
          record_keys=RECORD_KEYS, rounds=plan["rounds"], batch_size=1,
          paired_batches=True, evaluate=False, eval_every=plan["eval_every"],
          metrics_fn=metrics_fn)
      for r in run_records:
        r["iteration"] = r["round"] * method.local_steps
      records.extend(run_records)
      if result is None:  # diverged: reported by its note
        continue
      final = finals[method.label][seed]
      final["iteration"] = final["round"] * method.local_steps
      if test_eval is not None:
        final["test_acc"] = float(test_eval(result.params, test_chunks)["acc"][0])
  summary = summarize(finals, settings, config, test is not None)
  summary["alphabets"] = {part: [data.alphabet_names[a] for a in getattr(split, part)]
                          for part in ("train", "val", "test")}
  summary["wall_seconds"] = time.perf_counter() - start
  plot_curves(wd, records, config, [m.label for m in settings["methods"]])
  wd.write_summary(summary)  # last: it moves the outputs into place
  if options.progress:
    print(common.format_table(summary["table"]))
    print(f"wall time {summary['wall_seconds']:.1f} s")
  return summary


def summarize(finals, settings, config, has_test: bool) -> Dict[str, Any]:
  keys = ("val_acc", "train_loss", "train_acc", "val_loss") + (("test_acc",) if has_test else ())
  per_method, table = common.seed_statistics(finals, keys)
  summary = {"setting": f"{config.ways}-way {config.shots}-shot",
             "rounds": settings["rounds"], "local_steps": settings["local_steps"],
             "iterations": settings["iterations"], "seeds": list(settings["seeds"]),
             "methods": per_method, "table": table,
             "settings": {m.label: {**m.settings(), **schedule(m, settings)}
                          for m in settings["methods"]}}
  if "local_scgdm" in finals:
    val = lambda label, seed: finals[label].get(seed, {}).get("val_acc", float("nan"))
    for other in finals:
      if other != "local_scgdm":
        summary[f"local_scgdm_val_acc_above_{other}"] = {
            seed: val("local_scgdm", seed) > val(other, seed) for seed in settings["seeds"]}
  return summary


def plot_curves(wd, records, config, labels):
  """``curves.png`` (see :func:`figure`)."""
  fig = figure(records, config, labels)
  common.save_with_legend(wd, fig, fig.axes[0], "curves.png", legend=bool(fig.axes[0].lines))


def figure(records, config, labels):
  """Training loss and validation accuracy after adaptation against meta-iterations, mean
  +- std over seeds (one line style and marker per method)."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  fig = common.figure(figsize=(10, 4))
  axes = fig.subplots(1, 2)
  drawn = [label for label in labels if any(r["method"] == label for r in records)]
  panels = (("train_loss", "training loss (after adaptation)",
             "query cross-entropy on training tasks"),
            ("val_acc", "validation accuracy (after adaptation)",
             "query accuracy on validation tasks"))
  for ax, (key, title, ylabel) in zip(axes, panels):
    common.plot_mean_curves(ax, records, key, x="iteration", labels=drawn, band=0.15,
                            group="method")
    for i, line in enumerate(ax.get_lines()):  # methods can coincide: vary the style too
      line.set_linestyle(LINESTYLES[i % len(LINESTYLES)])
      line.set_marker(MARKERS[i % len(MARKERS)])
      line.set_markersize(3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("meta-iteration (round x local_steps)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"Omniglot {config.ways}-way {config.shots}-shot: {title}", fontsize=9)
    ax.grid(alpha=0.3)
  return fig
