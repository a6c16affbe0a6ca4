r"""E3: federated sinusoid meta-regression (paper 003, Sec. 5.1), fully offline.

Tasks ``y = A sin(x + b pi / 5)``, ``x ~ U[-5, 5]``: the 25 training tasks ``A, b in {1..5}``
are spread evenly at random over ``config.num_clients = 5`` clients; every local step each
client's episode (``batch_size = 1``) is a meta-batch of ``tasks_per_step = 3`` of its tasks,
``shots = 10`` support and ``query_shots = 10`` query points each; ``test_tasks = 600``
unseen test tasks with ``A ~ U[0.1, 5]``, ``b ~ U[0, 5]``. Model: MLP 1-40-40-1 with ReLU
(``hidden``); MAML inner lr ``inner_lr = 0.001``, ``inner_steps = 1``, second order
(``first_order = False``). Problem layout: :mod:`fedco.problems.maml` (an example is an
episode over all of a client's task slots, so trackers keep one memory per task, as the
paper does for Local-SCGDM and Local-MOML). The compared methods are ``config.methods``,
with the paper's settings and ``local_steps = 5``, 600 rounds (3000 meta-iterations):

* ``local_scgdm`` (Local-SCGDM): ``learning_rate`` (eta) 1, ``beta = 0.01``, ``alpha = 0.8``,
  ``gamma = 0.7``;
* ``comfedl`` (Local-BSGD = ComFedL-MAML): ``learning_rate = 0.01``;
* ``local_scgd`` (Local-SCGD): ``learning_rate = 0.01``, ``gamma = 0.9``;
* ``local_moml`` (Local-MOML): ``learning_rate = 0.01``, ``beta = 0.7``.

Local-SCGD(M) average their tracker ``u`` over clients every round (SPEC 2.2, 2.3). Here ``u``
is each client's table of per-task memories, so the average mixes slot ``t`` of different
clients (different tasks); with inner lr 0.001 the adapted parameters of all tasks are within
``0.001 * grad`` of ``w``, so the mix is small, and Local-SCGDM's tracker recovers at rate
``gamma * eta = 0.7`` per step. Local-MOML sends only ``w``.

Every run has the same ``rounds * local_steps`` meta-iterations: a method with its own
``local_steps`` (or the ``local_steps`` ablation) runs ``rounds * local_steps / its
local_steps`` rounds and evaluates at the same meta-iterations (``eval_every`` is in rounds
at the shared ``local_steps``). Reported per evaluation (streamed to ``metrics.jsonl`` /
``metrics.csv`` while runs go, one row per ``method``, ``seed`` and evaluated ``round``; the
meta-iteration is ``round * local_steps``): ``train_mse`` (post-adaptation query MSE over the
25 training tasks, 4 fresh draws each), ``val_mse`` (post-adaptation query MSE on the unseen
test tasks; the test set is the same for every seed and method, so comparisons are paired)
and ``val_mse_before`` (before adaptation). Final values are those of the last evaluated
round; ``*_tail`` average the evaluations past 80% of the meta-iterations.
``config.ablation = "gamma" | "alpha" | "local_steps"`` runs Local-SCGDM's ablations (paper
Figs. 3-5) over ``config.ablation_values`` instead of the methods.

    python -m experiments.main --config=experiments/configs/sinusoid.py --workdir=runs/e3
    python -m experiments.main --config=experiments/configs/sinusoid.py \
        --config.ablation=gamma --workdir=runs/e3_gamma

Writes ``config.json``, ``metrics.jsonl``, ``metrics.csv``, ``summary.json`` (final MSEs per
method and seed, mean +- std over seeds, ``local_scgdm_val_below_<label>`` per seed),
``mse.png`` (training and validation MSE against meta-iterations, mean +- std over seeds),
``fit.png`` (an unseen task, ``y = 2.5 sin(x + 1.5 pi / 5)`` as in the paper's Fig. 1,
before and after adaptation, first seed) and prints the final table.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.ticker import MaxNLocator

from experiments import common, runner
from fedco.data import sinusoid as sinusoid_data
from fedco.models.mlp import MLP, init_mlp
from fedco.problems.maml import MAML

ABLATION_DEFAULTS = {"gamma": (0.3, 0.5, 0.7, 0.9), "alpha": (0.5, 0.7, 0.8, 0.9),
                     "local_steps": (1, 2, 5, 10)}
# Local-SCGDM at the paper's settings: the ablations' base when config.methods has none.
SCGDM_DEFAULTS = {"learning_rate": 1.0, "beta": 0.01, "alpha": 0.8, "gamma": 0.7}
TEST_SEED = 12345  # one unseen test set for every seed and method (paired comparisons)
FIT_TASK = (2.5, 1.5)  # paper 003 Fig. 1: y = 5/2 sin(x + 3/2 * pi/5)
NUM_TRAIN_TASKS = 25
TAIL = 0.8  # *_tail: the evaluations past this fraction of the meta-iterations
RECORD_KEYS = ("train_mse", "val_mse", "val_mse_before")
TABLE_KEYS = ("val_mse", "train_mse", "val_mse_tail", "val_mse_before")
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "v", "D", "x")


def _build(method: runner.Method, where: str, **changes):
  """``method.build(**changes)``; the factory's ``ValueError`` names ``where`` (a method's
  field when ``where`` is the method and the factory names one of its arguments)."""
  try:
    return method.build(**changes)
  except ValueError as err:
    arg = (str(err).split() or [""])[0]
    own = where.startswith("--config.methods.") and arg in (*method.kwargs, "learning_rate")
    raise ValueError(f"{where}.{arg if own else ''}".rstrip(".") +
                     f" is invalid for fedco.{method.algorithm}: {err}") from None


def check(config) -> Dict[str, Any]:
  """The checked settings (``ValueError`` naming ``--config.<field>``)."""
  settings = runner.check_shared(config)
  for name in ("inner_steps", "num_clients", "tasks_per_step", "shots", "query_shots",
               "test_tasks", "episodes_per_client"):
    common.check_int(f"config.{name}", config[name], 1)
  common.check_positive("config.inner_lr", config.inner_lr)
  if not isinstance(config.first_order, bool):
    raise ValueError(f"--config.first_order must be a bool, got {config.first_order!r}")
  hidden = common.check_int_list("config.hidden", config.hidden, 1)
  if NUM_TRAIN_TASKS % config.num_clients:
    raise ValueError(f"--config.num_clients must divide the {NUM_TRAIN_TASKS} training tasks "
                     f"evenly (1, 5 or 25), got {config.num_clients}")
  per_client = NUM_TRAIN_TASKS // config.num_clients
  if config.tasks_per_step > per_client:
    raise ValueError(f"--config.tasks_per_step must be at most the {per_client} tasks of a "
                     f"client, got {config.tasks_per_step}")
  iterations = settings["rounds"] * settings["local_steps"]
  methods = runner.methods(config)
  for m in methods:
    where = f"--config.methods.{m.label}"
    _build(m, where)
    if iterations % m.local_steps:
      raise ValueError(f"{where}.local_steps must divide the {iterations} meta-iterations "
                       f"(config.rounds * config.local_steps), got {m.local_steps}")
  values = runner.ablation(config, ABLATION_DEFAULTS)
  if values:
    base = ablation_base(methods, settings)
  for v in values:
    if config.ablation == "local_steps":
      if iterations % v:
        raise ValueError(f"--config.ablation_values must divide the {iterations} "
                         f"meta-iterations (config.rounds * config.local_steps), got {v}")
    else:
      _build(base, "--config.ablation_values", **{config.ablation: v})
  return {**settings, "methods": methods, "ablation_values": values, "hidden": hidden,
          "iterations": iterations}


def ablation_base(methods, settings) -> runner.Method:
  """The config's (first) Local-SCGDM method, or Local-SCGDM at the paper's settings."""
  for m in methods:
    if m.algorithm == "local_scgdm":
      return m
  kwargs = {k: v for k, v in SCGDM_DEFAULTS.items() if k != "learning_rate"}
  return runner.Method("local_scgdm", "local_scgdm", kwargs, SCGDM_DEFAULTS["learning_rate"],
                       settings["local_steps"])


def runs(settings, config) -> List[runner.Method]:
  """The methods to run: the config's, or Local-SCGDM's ablation."""
  if config.ablation == "none":
    return list(settings["methods"])
  base, key = ablation_base(settings["methods"], settings), config.ablation
  out = []
  for v in settings["ablation_values"]:
    label = f"{base.label}_{key}={v:g}"
    if key == "local_steps":
      out.append(base.variant(label, local_steps=int(v)))
    else:
      out.append(base.variant(label, kwargs={**base.kwargs, key: v}))
  return out


def schedule(method: runner.Method, settings) -> Dict[str, int]:
  """A method's rounds and eval_every: the shared meta-iterations and evaluation points."""
  rounds = settings["iterations"] // method.local_steps
  every = settings["eval_every"] * settings["local_steps"] // method.local_steps
  return {"rounds": rounds, "eval_every": max(1, min(every, rounds))}


def _episode(arrays):
  return {k: jnp.asarray(v) for k, v in arrays.items() if k not in ("amplitude", "phase")}


def run(config, workdir, options: runner.Options = runner.Options()) -> Dict[str, Any]:
  """Runs E3 (or an ablation) and writes the outputs; returns the summary."""
  start = time.perf_counter()
  settings = check(config)
  wd = common.Workdir(workdir)
  wd.write_config(config.to_dict())
  common.start_checkpoints(wd, {"resume": options.resume})
  writers = runner.Writers(wd)
  model = MLP(hidden=settings["hidden"], out=1)
  meta = MAML(model.apply, config.inner_lr, config.inner_steps, config.first_order)
  problem = meta.problem("sinusoid_maml")
  test = _episode(sinusoid_data.unseen_tasks(TEST_SEED, num_tasks=config.test_tasks,
                                             shots=config.shots,
                                             query_shots=config.query_shots))
  shared = {k: config[k] for k in ("batch_size", "inner_lr", "inner_steps", "first_order",
                                   "num_clients", "tasks_per_step", "shots", "query_shots",
                                   "test_tasks", "episodes_per_client")}
  shared["hidden"] = list(settings["hidden"])
  methods = runs(settings, config)
  records, finals, fitted = [], {}, {}
  for seed in settings["seeds"]:
    fed, tasks = sinusoid_data.federated(
        seed, num_clients=config.num_clients, episodes_per_client=config.episodes_per_client,
        shots=config.shots, query_shots=config.query_shots,
        tasks_per_step=config.tasks_per_step)
    train_eval = _episode(sinusoid_data.training_eval_episode(
        tasks, TEST_SEED, shots=config.shots, query_shots=config.query_shots))
    params = init_mlp(model, 1, seed)

    def metrics_fn(w, train_eval=train_eval):
      return {"train_mse": jnp.mean(meta.adapted_losses(w, train_eval)),
              "val_mse": jnp.mean(meta.adapted_losses(w, test)),
              "val_mse_before": jnp.mean(meta.adapted_losses(w, test, steps=0))}

    for method in methods:
      plan = schedule(method, settings)
      run_records = []
      result = runner.simulate_method(
          method, seed, problem=problem, algorithm=method.build(), data=fed, params=params,
          wd=wd, options=options, writers=writers, settings={**shared, **plan},
          finals=finals, records=run_records, progress_metric="val_mse",
          record_keys=RECORD_KEYS, rounds=plan["rounds"],
          batch_size=settings["batch_size"] or None, evaluate=False,
          eval_every=plan["eval_every"], metrics_fn=metrics_fn)
      for r in run_records:
        r["iteration"] = r["round"] * method.local_steps
      records.extend(run_records)
      if result is None:
        continue
      tail = [r for r in run_records
              if r["iteration"] > TAIL * settings["iterations"]] or run_records[-1:]
      final = finals[method.label][seed]
      final["iteration"] = final["round"] * method.local_steps
      for key in ("val_mse", "train_mse"):
        final[f"{key}_tail"] = float(np.mean([r[key] for r in tail]))
      if seed == settings["seeds"][0]:
        fitted[method.label] = result.params
  summary = summarize(finals, settings, config, methods)
  summary["wall_seconds"] = time.perf_counter() - start
  labels = [m.label for m in methods]
  plot_curves(wd, records, labels)
  plot_fit(wd, fitted, meta, config, labels)
  wd.write_summary(summary)
  if options.progress:
    print(common.format_table(summary["table"]))
    print(f"wall time {summary['wall_seconds']:.1f} s")
  return summary


def summarize(finals, settings, config, methods) -> Dict[str, Any]:
  per_method, table = common.seed_statistics(finals, TABLE_KEYS)
  summary = {"ablation": config.ablation, "rounds": settings["rounds"],
             "local_steps": settings["local_steps"], "iterations": settings["iterations"],
             "seeds": list(settings["seeds"]), "methods": per_method, "table": table,
             "settings": {m.label: {**m.settings(), **schedule(m, settings)}
                          for m in methods}}
  if "local_scgdm" in finals:
    val = lambda label, seed: finals[label].get(seed, {}).get("val_mse", float("nan"))
    for other in finals:
      if other != "local_scgdm":
        summary[f"local_scgdm_val_below_{other}"] = {
            seed: val("local_scgdm", seed) < val(other, seed) for seed in settings["seeds"]}
  return summary


def plot_curves(wd, records, labels):
  """Training and validation MSE against meta-iterations, mean +- std over seeds."""
  fig = common.figure(figsize=(10, 4))
  axes = fig.subplots(1, 2)
  drawn = [label for label in labels if any(r["method"] == label for r in records)]
  for ax, key, title in zip(axes, ("train_mse", "val_mse"),
                            ("training tasks", "unseen test tasks")):
    common.plot_mean_curves(ax, records, key, x="iteration", labels=drawn, band=0.15,
                            group="method")
    for i, line in enumerate(ax.get_lines()):  # ablation runs can nearly coincide
      line.set_linestyle(LINESTYLES[i % len(LINESTYLES)])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("meta-iteration (round x local_steps)")
    ax.set_ylabel("post-adaptation query MSE")
    ax.set_title(f"sinusoid: {title}")
    ax.grid(alpha=0.3)
  common.save_with_legend(wd, fig, axes[0], "mse.png", legend=bool(drawn))


def plot_fit(wd, fitted, meta, config, labels):
  """The paper's Fig. 1 task, fitted from ``shots`` support points, before/after adapting
  (the first seed's models)."""
  amplitude, phase = FIT_TASK
  rng = np.random.default_rng(TEST_SEED)
  sx, sy = sinusoid_data.draw_points(rng, np.float32(amplitude), np.float32(phase),
                                     config.shots)
  grid = np.linspace(-5, 5, 200, dtype=np.float32)[:, None]

  @jax.jit
  def curves(params, sx, sy, grid):
    adapted = meta.adapt(params, sx, sy, first_order=True)
    predict = lambda p: jax.vmap(lambda x: meta.apply_fn(p, x))(grid)[:, 0]
    return predict(params), predict(adapted)

  fig = common.figure(figsize=(6, 4))
  ax = fig.add_subplot()
  ax.plot(grid[:, 0], sinusoid_data.sinusoid(grid[:, 0], amplitude, phase), "k",
          label="ground truth")
  ax.scatter(sx[:, 0], sy[:, 0], c="k", marker="x", zorder=3, label="support shots")
  shown = [label for label in labels if label in fitted]
  for i, label in enumerate(shown):
    before, after = curves(fitted[label], sx, sy, grid)
    # markers at staggered points keep curves that coincide apart
    line, = ax.plot(grid[:, 0], after, marker=MARKERS[i % len(MARKERS)], markersize=4,
                    markevery=(i * 20 // max(1, len(shown)), 20), label=f"{label} (adapted)")
    ax.plot(grid[:, 0], before, "--", color=line.get_color(), alpha=0.5, linewidth=1)
  ax.set_title(f"unseen task y = {amplitude:g} sin(x + {phase:g} pi/5); dashed: before "
               f"{config.inner_steps} step(s) at lr {config.inner_lr:g}", fontsize=8)
  ax.set_xlabel("x")
  ax.set_ylabel("y")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  wd.save_figure(fig, "fit.png")
