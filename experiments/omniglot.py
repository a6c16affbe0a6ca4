r"""E4: federated few-shot Omniglot (paper 003, Sec. 5.2).

One client per training alphabet (Vinyals split: 33 train / 5 validation / 12 test
alphabets, see :mod:`fedco.data.omniglot`); ``N``-way ``K``-shot tasks drawn within the
client's alphabet with 15 query images per class; rotations by multiples of 90 degrees are
new classes. Model: MAML's Omniglot CNN (``fedco.models.OmniglotCNN``: four blocks of 64
3x3 filters, batch normalisation with the task's own statistics, ReLU, 2x2 max-pool); MAML
inner lr 0.4, one second-order step. Algorithms, with paper 003's 5-way 1-shot settings:

* Local-SCGDM (``fedco.local_scgdm``): ``eta = 1, beta = 0.1, alpha = 0.9, gamma = 0.99``;
* Local-BSGD = ComFedL-MAML (``fedco.comfedl``): lr 0.1;
* Local-SCGD (``fedco.local_scgd``): lr 0.1, ``gamma = 0.99``.

(Local-MOML is left out, as in the paper: it keeps a memory per task.) Paper 003 does not
give the local period ``p``, the meta-batch, the number of iterations or the test protocol;
the defaults here are ``p = 5`` (its sinusoid setting), one task per client per step (33
tasks per meta-iteration, about MAML's 32), 1000 rounds, and evaluation with the training
inner step.

Problem layout: an example is an episode of ``--tasks_per_episode`` independent random tasks
(a meta-batch); each step draws one episode per client (``batch_size=1``) and uses it for
both the inner map (support sets) and the outer (its own query sets), which is
``simulate(..., paired_batches=True)``. The model sees a task's images together (batch
statistics), so the MAML task loss applies it to the whole set (:class:`TaskMAML`) instead of
vmapping over single images.

Reported per evaluation (every ``--eval_every`` rounds and at the end): ``train_loss`` /
``train_acc`` (query cross-entropy and accuracy after adaptation on the first pre-drawn
episode of every client: ``K * T`` training tasks) and ``val_loss`` / ``val_acc`` (the same
on ``--val_tasks`` fresh tasks of the validation alphabets; one set for every seed and
algorithm, so comparisons are paired). At the end, ``test_acc`` on ``--test_tasks`` tasks of
the test alphabets. Adaptation at evaluation uses ``--eval_inner_steps`` steps.

    python -m experiments.omniglot --workdir=runs/e4 --data_dir=~/tensorflow_datasets
    python -m experiments.omniglot --workdir=runs/e4_5w5s --shots=5
    python -m experiments.omniglot --workdir=runs/e4_20w1s --ways=20

Needs TFDS ``omniglot`` prepared as ``array_record`` (``tfds build omniglot
--file_format=array_record``, once, with TensorFlow and network; see
:mod:`fedco.data.sources`). Writes ``config.json``, ``metrics.jsonl``, ``summary.json``
(final validation and test accuracy per algorithm and seed, mean/std over seeds) and
``curves.png``, prints the final table, and checkpoints every run under
``--workdir/checkpoints/`` (rerunning resumes; ``--noresume`` starts over).
"""

from __future__ import annotations

import dataclasses
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
from fedco.data import omniglot as omniglot_data
from fedco.models import OmniglotCNN, cross_entropy, init_cnn
from fedco.problems.maml import MAML

ALGORITHMS = ("local_scgdm", "local_bsgd", "local_scgd")
LABELS = {"local_scgdm": "Local-SCGDM", "local_bsgd": "Local-BSGD (ComFedL-MAML)",
          "local_scgd": "Local-SCGD"}
EVAL_SEED = 12345    # one validation / test task set for every seed and algorithm
DRAWINGS = 20        # drawings per Omniglot character
SPLIT_SEED = 0       # the "random" alphabet split does not change with --seeds

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "Output directory (created if missing).")
  flags.DEFINE_string("data_dir", None, "TFDS data directory holding omniglot prepared as "
                      "array_record (default: TFDS_DATA_DIR or ~/tensorflow_datasets).")
  flags.DEFINE_list("algorithms", list(ALGORITHMS), f"Comma list from {', '.join(ALGORITHMS)}.")
  flags.DEFINE_integer("ways", 5, "N: classes per task.")
  flags.DEFINE_integer("shots", 1, "K: support images per class.")
  flags.DEFINE_integer("query", 15, "Query images per class.")
  flags.DEFINE_integer("tasks_per_episode", 1, "Tasks per client per step (the meta-batch).")
  flags.DEFINE_float("inner_lr", 0.4, "MAML inner (adaptation) learning rate.")
  flags.DEFINE_integer("inner_steps", 1, "MAML inner steps in training.")
  flags.DEFINE_integer("eval_inner_steps", 1, "Adaptation steps at evaluation.")
  flags.DEFINE_bool("first_order", False, "First-order MAML inner map.")
  flags.DEFINE_integer("rounds", 1000, "Communication rounds.")
  flags.DEFINE_integer("local_steps", 5, "p: local steps between communications.")
  flags.DEFINE_float("eta", 1.0, "Local-SCGDM eta.")
  flags.DEFINE_float("beta", 0.1, "Local-SCGDM meta learning-rate coefficient beta.")
  flags.DEFINE_float("alpha", 0.9, "Local-SCGDM momentum coefficient alpha.")
  flags.DEFINE_float("gamma", 0.99, "Local-SCGDM inner-state coefficient gamma.")
  flags.DEFINE_float("bsgd_lr", 0.1, "Local-BSGD (ComFedL-MAML) meta learning rate.")
  flags.DEFINE_float("scgd_lr", 0.1, "Local-SCGD meta learning rate.")
  flags.DEFINE_float("scgd_gamma", 0.99, "Local-SCGD inner-state coefficient.")
  flags.DEFINE_integer("filters", 64, "Convolution channels of the CNN.")
  flags.DEFINE_enum("alphabet_split", "vinyals", list(omniglot_data.SPLITS),
                    "vinyals (33/5/12 named alphabets) or random (seeded, --split_sizes).")
  flags.DEFINE_list("split_sizes", [str(s) for s in omniglot_data.VINYALS_SIZES],
                    "Train, val, test alphabet counts for --alphabet_split=random.")
  flags.DEFINE_bool("rotations", True, "Rotations by multiples of 90 degrees as new classes.")
  flags.DEFINE_integer("episodes_per_client", 256, "Pre-drawn training episodes per client.")
  flags.DEFINE_integer("val_tasks", 100, "Validation tasks evaluated every --eval_every.")
  flags.DEFINE_integer("test_tasks", 600, "Test tasks evaluated at the end (0: none).")
  flags.DEFINE_integer("eval_chunk", 25, "Tasks per vectorised evaluation chunk (memory).")
  flags.DEFINE_integer("eval_every", 10, "Evaluate every this many rounds.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Comma list of integer seeds.")
  flags.DEFINE_bool("progress", True, "Print a progress line per run.")
  common.define_checkpoint_flags(100)


def validate(workdir, *, data_dir=None, algorithms=ALGORITHMS, ways=5, shots=1, query=15,
             tasks_per_episode=1, inner_lr=0.4, inner_steps=1, eval_inner_steps=1,
             first_order=False, rounds=1000, local_steps=5, eta=1.0, beta=0.1, alpha=0.9,
             gamma=0.99, bsgd_lr=0.1, scgd_lr=0.1, scgd_gamma=0.99, filters=64,
             alphabet_split="vinyals", split_sizes=omniglot_data.VINYALS_SIZES,
             rotations=True, episodes_per_client=256, val_tasks=100, test_tasks=600,
             eval_chunk=25, eval_every=10, seeds=(0, 1, 2), progress=True,
             checkpoint_every=100, resume=True) -> Dict[str, Any]:
  """Checks every setting and returns the run's config; raises ``ValueError`` naming the flag."""
  algorithms = common.check_names("algorithms", algorithms, ALGORITHMS)
  if data_dir is not None and (not isinstance(data_dir, str) or not data_dir.strip()):
    raise ValueError(f"--data_dir must be a folder path, got {data_dir!r}")
  common.check_int("ways", ways, 2)
  for name, value in (("shots", shots), ("query", query),
                      ("tasks_per_episode", tasks_per_episode), ("inner_steps", inner_steps),
                      ("rounds", rounds), ("local_steps", local_steps), ("filters", filters),
                      ("episodes_per_client", episodes_per_client), ("val_tasks", val_tasks),
                      ("eval_chunk", eval_chunk), ("eval_every", eval_every)):
    common.check_int(name, value, 1)
  common.check_int("eval_inner_steps", eval_inner_steps, 0)
  common.check_int("test_tasks", test_tasks, 0)
  if shots + query > DRAWINGS:
    raise ValueError(f"--shots + --query must be at most {DRAWINGS} (the drawings of an "
                     f"Omniglot character), got shots={shots}, query={query}")
  for name, value in (("inner_lr", inner_lr), ("eta", eta), ("beta", beta),
                      ("bsgd_lr", bsgd_lr), ("scgd_lr", scgd_lr)):
    common.check_positive(name, value)
  for name, value in (("alpha", alpha), ("gamma", gamma)):
    common.check_real(name, value, low=0.0)
    if not 0 < value * eta < 1:
      raise ValueError(f"--{name} times --eta must lie in (0, 1) (Local-SCGDM's moving "
                       f"averages), got {name}={value!r}, eta={eta!r}")
  common.check_real("scgd_gamma", scgd_gamma, low=0.0, high=1.0)
  for name, value in (("first_order", first_order), ("rotations", rotations)):
    if not isinstance(value, bool):
      raise ValueError(f"--{name} must be a bool, got {value!r}")
  if alphabet_split not in omniglot_data.SPLITS:
    raise ValueError(f"--alphabet_split must be one of {omniglot_data.SPLITS}, got "
                     f"{alphabet_split!r}")
  try:
    sizes = tuple(int(s) for s in split_sizes)
  except (TypeError, ValueError):
    raise ValueError(f"--split_sizes must be three integers (train, val, test), got "
                     f"{split_sizes!r}") from None
  if len(sizes) != 3 or sizes[0] < 1 or sizes[1] < 1 or sizes[2] < 0:
    raise ValueError(f"--split_sizes must be three integers train >= 1, val >= 1, test >= 0, "
                     f"got {split_sizes!r}")
  if alphabet_split == "vinyals" and sizes != omniglot_data.VINYALS_SIZES:
    raise ValueError(f"--split_sizes: the vinyals split is {omniglot_data.VINYALS_SIZES}; use "
                     f"--alphabet_split=random for {sizes}")
  seeds = common.check_int_list("seeds", seeds, 0, distinct=True)
  return {"workdir": common.check_workdir(workdir), "data_dir": data_dir,
          "algorithms": algorithms, "ways": ways, "shots": shots, "query": query,
          "tasks_per_episode": tasks_per_episode, "inner_lr": inner_lr,
          "inner_steps": inner_steps, "eval_inner_steps": eval_inner_steps,
          "first_order": first_order, "rounds": rounds, "local_steps": local_steps,
          "eta": eta, "beta": beta, "alpha": alpha, "gamma": gamma, "bsgd_lr": bsgd_lr,
          "scgd_lr": scgd_lr, "scgd_gamma": scgd_gamma, "filters": filters,
          "alphabet_split": alphabet_split, "split_sizes": sizes, "rotations": rotations,
          "episodes_per_client": episodes_per_client, "val_tasks": val_tasks,
          "test_tasks": test_tasks, "eval_chunk": eval_chunk, "eval_every": eval_every,
          "seeds": seeds, "progress": progress,
          **common.checkpoint_config(checkpoint_every, resume)}


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
  model = OmniglotCNN(num_classes=config["ways"], filters=config["filters"])

  def apply_fn(params, x):  # uint8 images (255 = stroke) -> float in [0, 1]
    return model.apply(params, jnp.asarray(x, jnp.float32) * (1.0 / 255.0))

  meta = TaskMAML(apply_fn, config["inner_lr"], config["inner_steps"], config["first_order"],
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
  return max(1, min(config["eval_chunk"], max(sizes)))


def runs(config) -> List[Dict[str, Any]]:
  """The runs the config asks for: label, algorithm, and its hyperparameters."""
  keys = {"local_scgdm": ("eta", "beta", "alpha", "gamma"), "local_bsgd": ("bsgd_lr",),
          "local_scgd": ("scgd_lr", "scgd_gamma")}
  return [{"label": a, "algorithm": a, "p": config["local_steps"],
           **{k: config[k] for k in keys[a]}} for a in config["algorithms"]]


def make_algorithm(spec, config):
  name, p = spec["algorithm"], config["local_steps"]
  if name == "local_scgdm":
    return fedco.local_scgdm(config["eta"], p, beta=config["beta"], alpha=config["alpha"],
                             gamma=config["gamma"])
  if name == "local_bsgd":
    return fedco.comfedl(config["bsgd_lr"], p)
  return fedco.local_scgd(config["scgd_lr"], p, gamma=config["scgd_gamma"])


def load_data(config):
  """The Omniglot arrays and the alphabet split (raises FileNotFoundError when missing)."""
  data = omniglot_data.load_omniglot(config["data_dir"])
  split = omniglot_data.split_alphabets(data, config["alphabet_split"],
                                        sizes=config["split_sizes"], seed=SPLIT_SEED)
  return data, split


def _task_kwargs(config):
  return {"ways": config["ways"], "shots": config["shots"], "query": config["query"],
          "rotations": config["rotations"]}


def run(workdir, **kwargs) -> Dict[str, Any]:
  """Runs E4 and writes the outputs; returns the summary."""
  start = time.perf_counter()
  config = validate(workdir, **kwargs)
  data, split = load_data(config)
  task = _task_kwargs(config)
  val = omniglot_data.evaluation_episode(data, split.val, EVAL_SEED,
                                         num_tasks=config["val_tasks"], stream=1, **task)
  test = None
  if config["test_tasks"] and split.test:
    test = omniglot_data.evaluation_episode(data, split.test, EVAL_SEED,
                                            num_tasks=config["test_tasks"], stream=2, **task)
  wd = common.Workdir(config["workdir"])
  wd.write_config({**config, "alphabets": {
      part: [data.alphabet_names[a] for a in getattr(split, part)]
      for part in ("train", "val", "test")}})
  common.start_checkpoints(wd, config)
  model, meta = make_model(config)
  problem = meta.problem("omniglot_maml")
  steps = config["eval_inner_steps"]
  test_eval = None
  if test is not None:
    test_eval = jax.jit(lambda p, c: evaluate(meta, p, c, steps, 1))
    test_chunks = jax.tree.map(jnp.asarray, chunked(
        [test], _chunk_size(config, config["test_tasks"])))
  ckpt_config = {k: v for k, v in config.items() if k != "data_dir"}  # location, not setting

  records, finals = [], {}
  for seed in config["seeds"]:
    fed = omniglot_data.federated(data, split.train, seed,
                                  tasks_per_episode=config["tasks_per_episode"],
                                  episodes_per_client=config["episodes_per_client"], **task)
    first = np.asarray(fed.flat_rows)[np.asarray(fed.offsets)]  # each client's first episode
    train_eval = {k: np.asarray(v)[first].reshape((-1,) + np.shape(v)[2:])
                  for k, v in fed.examples.items() if k != "task_weight"}
    sizes = (train_eval["support_x"].shape[0], config["val_tasks"])
    eval_chunks = jax.tree.map(jnp.asarray, chunked([train_eval, val],
                                                    _chunk_size(config, *sizes)))
    params = init_cnn(model, (omniglot_data.IMAGE_SIZE, omniglot_data.IMAGE_SIZE, 1), seed)

    def metrics_fn(w, eval_chunks=eval_chunks):
      out = evaluate(meta, w, eval_chunks, steps, 2)  # set 0: training tasks, 1: validation
      return {"train_loss": out["loss"][0], "train_acc": out["acc"][0],
              "val_loss": out["loss"][1], "val_acc": out["acc"][1]}

    for spec in runs(config):
      algorithm = make_algorithm(spec, config)
      rounds = config["rounds"]
      t0 = time.perf_counter()
      try:
        result = fedco.simulate(
            problem, algorithm, fed, params, rounds=rounds, seed=seed, batch_size=1,
            paired_batches=True, evaluate=False, eval_every=min(config["eval_every"], rounds),
            metrics_fn=metrics_fn, progress=config["progress"], progress_metric="val_acc",
            **common.checkpoint_args(ckpt_config, f"{spec['label']}-seed{seed}", **spec,
                                     seed=seed))
      except fedco.runtime.NonFiniteError as err:  # report a diverged run, keep the others
        finals.setdefault(spec["label"], {})[seed] = {"diverged": str(err),
                                                      "diverged_round": err.round}
        records.extend(_records(err.metrics, spec, seed, config, True))
        continue
      m = result.metrics
      recs = _records(m, spec, seed, config, False)
      if not m["evaluated"][-1]:  # always report the last round
        last = jax.device_get(jax.jit(metrics_fn)(result.params))
        recs.append({"round": rounds, "iteration": rounds * config["local_steps"],
                     "algorithm": spec["label"], "seed": seed,
                     **{k: float(v) for k, v in last.items()}})
      records.extend(recs)
      final = {k: recs[-1][k] for k in ("train_loss", "train_acc", "val_loss", "val_acc")}
      if test_eval is not None:
        final["test_acc"] = float(test_eval(result.params, test_chunks)["acc"][0])
      final["seconds"] = time.perf_counter() - t0
      if not all(np.isfinite(v) for v in final.values()):
        final["diverged"] = "non-finite final metrics"
      finals.setdefault(spec["label"], {})[seed] = final
  wd.append_metrics(records)
  summary = summarize(finals, config, test is not None)
  summary["wall_seconds"] = time.perf_counter() - start
  plot_curves(wd, records, config)
  wd.write_summary(summary)
  if config["progress"]:
    print(common.format_table(summary["table"]))
    print(f"wall time {summary['wall_seconds']:.1f} s")
  return summary


def _records(metrics, spec, seed, config, finite_only):
  return common.evaluated_records(
      metrics, lambda rnd: {"iteration": rnd * config["local_steps"],
                            "algorithm": spec["label"], "seed": seed},
      keys=("train_loss", "train_acc", "val_loss", "val_acc"),
      finite_keys=("train_loss", "val_loss"), finite_only=finite_only)


def summarize(finals, config, has_test: bool) -> Dict[str, Any]:
  keys = ("val_acc", "train_loss", "train_acc", "val_loss") + (("test_acc",) if has_test else ())
  per_algorithm, table = common.seed_statistics(
      finals, keys, std_in_table=("val_acc",) + (("test_acc",) if has_test else ()))
  summary = {"setting": f"{config['ways']}-way {config['shots']}-shot",
             "rounds": config["rounds"], "local_steps": config["local_steps"],
             "seeds": list(config["seeds"]), "algorithms": per_algorithm, "table": table}
  if "local_scgdm" in finals:
    for other in ("local_bsgd", "local_scgd"):
      if other in finals:
        summary[f"scgdm_val_acc_above_{other}"] = {
            seed: (finals["local_scgdm"].get(seed, {}).get("val_acc", float("nan"))
                   > finals[other].get(seed, {}).get("val_acc", float("nan")))
            for seed in config["seeds"]}
  return summary


def plot_curves(wd, records, config):
  fig = common.figure(figsize=(10, 4))
  axes = fig.subplots(1, 2)
  for ax, key, title in zip(axes, ("train_loss", "val_acc"),
                            ("training loss (after adaptation)",
                             "validation accuracy (after adaptation)")):
    common.plot_mean_curves(ax, records, key, x="iteration", band=0.15, label_names=LABELS)
    ax.set_xlabel("meta-iteration")
    ax.set_title(f"Omniglot {config['ways']}-way {config['shots']}-shot: {title}", fontsize=9)
    ax.grid(alpha=0.3)
  common.save_with_legend(wd, fig, axes[0], "curves.png", legend=bool(records))


def main(argv):
  del argv
  common.quiet_logs()
  try:
    run(FLAGS.workdir, data_dir=FLAGS.data_dir, algorithms=FLAGS.algorithms, ways=FLAGS.ways,
        shots=FLAGS.shots, query=FLAGS.query, tasks_per_episode=FLAGS.tasks_per_episode,
        inner_lr=FLAGS.inner_lr, inner_steps=FLAGS.inner_steps,
        eval_inner_steps=FLAGS.eval_inner_steps, first_order=FLAGS.first_order,
        rounds=FLAGS.rounds, local_steps=FLAGS.local_steps, eta=FLAGS.eta, beta=FLAGS.beta,
        alpha=FLAGS.alpha, gamma=FLAGS.gamma, bsgd_lr=FLAGS.bsgd_lr, scgd_lr=FLAGS.scgd_lr,
        scgd_gamma=FLAGS.scgd_gamma, filters=FLAGS.filters,
        alphabet_split=FLAGS.alphabet_split, split_sizes=FLAGS.split_sizes,
        rotations=FLAGS.rotations, episodes_per_client=FLAGS.episodes_per_client,
        val_tasks=FLAGS.val_tasks, test_tasks=FLAGS.test_tasks, eval_chunk=FLAGS.eval_chunk,
        eval_every=FLAGS.eval_every, seeds=FLAGS.seeds, progress=FLAGS.progress,
        checkpoint_every=FLAGS.checkpoint_every, resume=FLAGS.resume)
  except (ValueError, FileNotFoundError, ImportError) as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
