r"""E3: federated sinusoid meta-regression (paper 003, Sec. 5.1), fully offline.

Tasks ``y = A sin(x + b pi / 5)``, ``x ~ U[-5, 5]``: the 25 training tasks ``A, b in {1..5}``
are spread evenly at random over 5 clients; every meta-iteration each client's meta-batch is
3 of its tasks, 10 support and 10 query shots each; 600 unseen test tasks with
``A ~ U[0.1, 5]``, ``b ~ U[0, 5]``. Model: MLP 1-40-40-1 with ReLU; MAML inner lr 0.001
(one step, second order). Problem layout: :mod:`fedco.problems.maml` (an example is an
episode over all of a client's task slots, so trackers keep one memory per task, as the
paper does for Local-SCGDM and Local-MOML). Algorithms, with the paper's settings and
``p = 5`` local steps:

* Local-SCGDM (``fedco.local_scgdm``): ``eta = 1, beta = 0.01, alpha = 0.8, gamma = 0.7``;
* Local-BSGD = ComFedL-MAML (``fedco.comfedl``): lr 0.01;
* Local-SCGD (``fedco.local_scgd``): lr 0.01, ``gamma = 0.9``;
* Local-MOML (``fedco.algorithms.moml.local_moml``): lr 0.01, ``beta = 0.7``.

Local-SCGD(M) average their tracker ``u`` over clients every round (SPEC 2.2, 2.3). Here ``u``
is each client's table of per-task memories, so the average mixes slot ``t`` of different
clients (different tasks); with inner lr 0.001 the adapted parameters of all tasks are within
``0.001 * grad`` of ``w``, so the mix is small, and Local-SCGDM's tracker recovers at rate
``gamma * eta = 0.7`` per step. Local-MOML sends only ``w``.

Reported per evaluation: training MSE (post-adaptation query MSE over the 25 training tasks,
4 fresh draws each) and validation MSE (post-adaptation query MSE on the 600 test tasks; the
test set is the same for every seed and algorithm, so comparisons are paired), plus the
validation MSE before adaptation. ``--sweep=gamma|p|alpha`` runs Local-SCGDM's ablations
(paper Figs. 3-5) instead; ``p`` sweeps keep the number of meta-iterations fixed.

    python -m experiments.sinusoid --workdir=runs/e3
    python -m experiments.sinusoid --workdir=runs/e3_gamma --sweep=gamma

Writes ``config.json``, ``metrics.jsonl``, ``summary.json`` (final validation MSE per
algorithm and seed, mean/std over seeds), ``mse.png`` (training and validation MSE against
meta-iterations), ``fit.png`` (an unseen task, ``y = 2.5 sin(x + 1.5 pi / 5)`` as in the
paper's Fig. 1, before and after adaptation) and prints the final table.
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

import fedco
from experiments import common
from fedco.algorithms.moml import local_moml
from fedco.data import sinusoid as sinusoid_data
from fedco.models.mlp import MLP, init_mlp
from fedco.problems.maml import MAML

ALGORITHMS = ("local_scgdm", "local_bsgd", "local_scgd", "local_moml")
LABELS = {"local_scgdm": "Local-SCGDM", "local_bsgd": "Local-BSGD (ComFedL-MAML)",
          "local_scgd": "Local-SCGD", "local_moml": "Local-MOML"}
SWEEPS = ("none", "gamma", "p", "alpha")
SWEEP_DEFAULTS = {"gamma": (0.3, 0.5, 0.7, 0.9), "p": (1, 2, 5, 10),
                  "alpha": (0.5, 0.7, 0.8, 0.9)}
TEST_SEED = 12345  # one unseen test set for every seed and algorithm (paired comparisons)
FIT_TASK = (2.5, 1.5)  # paper 003 Fig. 1: y = 5/2 sin(x + 3/2 * pi/5)
NUM_TRAIN_TASKS = 25

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "Output directory (created if missing).")
  flags.DEFINE_list("algorithms", list(ALGORITHMS), f"Comma list from {', '.join(ALGORITHMS)}.")
  flags.DEFINE_integer("iterations", 3000, "Meta-iterations (local steps per client).")
  flags.DEFINE_integer("p", 5, "Local steps between communications, every algorithm.")
  flags.DEFINE_float("eta", 1.0, "Local-SCGDM eta.")
  flags.DEFINE_float("beta", 0.01, "Local-SCGDM meta learning-rate coefficient beta.")
  flags.DEFINE_float("alpha", 0.8, "Local-SCGDM momentum coefficient alpha.")
  flags.DEFINE_float("gamma", 0.7, "Local-SCGDM inner-state coefficient gamma.")
  flags.DEFINE_float("bsgd_lr", 0.01, "Local-BSGD (ComFedL-MAML) meta learning rate.")
  flags.DEFINE_float("scgd_lr", 0.01, "Local-SCGD meta learning rate.")
  flags.DEFINE_float("scgd_gamma", 0.9, "Local-SCGD inner-state coefficient.")
  flags.DEFINE_float("moml_lr", 0.01, "Local-MOML meta learning rate.")
  flags.DEFINE_float("moml_beta", 0.7, "Local-MOML memory coefficient.")
  flags.DEFINE_float("inner_lr", 0.001, "MAML inner (adaptation) learning rate.")
  flags.DEFINE_integer("inner_steps", 1, "MAML inner steps (training and evaluation).")
  flags.DEFINE_bool("first_order", False, "First-order MAML inner map.")
  flags.DEFINE_list("hidden", ["40", "40"], "Hidden layer widths of the MLP.")
  flags.DEFINE_integer("num_clients", 5, "Clients (must divide the 25 training tasks).")
  flags.DEFINE_integer("tasks_per_step", 3, "Tasks per client per meta-iteration.")
  flags.DEFINE_integer("shots", 10, "Support points per task.")
  flags.DEFINE_integer("query_shots", 10, "Query points per task.")
  flags.DEFINE_integer("test_tasks", 600, "Unseen test tasks.")
  flags.DEFINE_integer("episodes_per_client", 1000, "Pre-drawn training episodes per client.")
  flags.DEFINE_integer("eval_every", 25, "Evaluate every this many rounds.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Comma list of integer seeds.")
  flags.DEFINE_enum("sweep", "none", list(SWEEPS), "Run a Local-SCGDM ablation instead.")
  flags.DEFINE_list("sweep_values", [], "Values for --sweep (default: a grid around the "
                    "paper's setting).")
  flags.DEFINE_bool("progress", True, "Print a progress line per run.")
  common.define_checkpoint_flags(100)


def validate(workdir, *, algorithms=ALGORITHMS, iterations=3000, p=5, eta=1.0, beta=0.01,
             alpha=0.8, gamma=0.7, bsgd_lr=0.01, scgd_lr=0.01, scgd_gamma=0.9, moml_lr=0.01,
             moml_beta=0.7, inner_lr=0.001, inner_steps=1, first_order=False,
             hidden=(40, 40), num_clients=5, tasks_per_step=3, shots=10, query_shots=10,
             test_tasks=600, episodes_per_client=1000, eval_every=25, seeds=(0, 1, 2),
             sweep="none", sweep_values=(), progress=True, checkpoint_every=100,
             resume=True) -> Dict[str, Any]:
  """Checks every setting and returns the run's config; raises ``ValueError`` naming the flag."""
  algorithms = common.check_names("algorithms", algorithms, ALGORITHMS)
  if sweep not in SWEEPS:
    raise ValueError(f"--sweep must be one of {SWEEPS}, got {sweep!r}")
  for name, value in (("iterations", iterations), ("p", p), ("inner_steps", inner_steps),
                      ("num_clients", num_clients), ("tasks_per_step", tasks_per_step),
                      ("shots", shots), ("query_shots", query_shots),
                      ("test_tasks", test_tasks), ("episodes_per_client", episodes_per_client),
                      ("eval_every", eval_every)):
    common.check_int(name, value, 1)
  for name, value in (("eta", eta), ("beta", beta), ("bsgd_lr", bsgd_lr),
                      ("scgd_lr", scgd_lr), ("moml_lr", moml_lr), ("inner_lr", inner_lr)):
    common.check_positive(name, value)
  common.check_real("alpha", alpha, low=0.0)
  common.check_real("gamma", gamma, low=0.0)
  _check_rate("alpha", alpha, eta)
  _check_rate("gamma", gamma, eta)
  common.check_real("scgd_gamma", scgd_gamma, low=0.0, high=1.0)
  common.check_real("moml_beta", moml_beta, low=0.0, high=1.0)
  if not isinstance(first_order, bool):
    raise ValueError(f"--first_order must be a bool, got {first_order!r}")
  hidden = common.check_int_list("hidden", hidden, 1)
  if NUM_TRAIN_TASKS % num_clients:
    raise ValueError(f"--num_clients must divide the {NUM_TRAIN_TASKS} training tasks "
                     f"evenly (1, 5 or 25), got {num_clients}")
  per_client = NUM_TRAIN_TASKS // num_clients
  if tasks_per_step > per_client:
    raise ValueError(f"--tasks_per_step must be at most the {per_client} tasks of a client, "
                     f"got {tasks_per_step}")
  if iterations % p:
    raise ValueError(f"--iterations must be a multiple of --p={p}, got {iterations}")
  seeds = common.check_int_list("seeds", seeds, 0)
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"--seeds lists a seed twice: {seeds}")
  values = ()
  if sweep != "none":
    raw = sweep_values or SWEEP_DEFAULTS[sweep]
    try:
      values = tuple(float(v) for v in raw)
    except (TypeError, ValueError):
      raise ValueError(f"--sweep_values must be numbers, got {sweep_values!r}") from None
    if len(set(values)) != len(values):
      raise ValueError(f"--sweep_values lists a value twice: {values}")
    for v in values:
      if sweep == "p":
        if not float(v).is_integer():
          raise ValueError(f"--sweep_values for p must be integers, got {v!r}")
        common.check_int("sweep_values", int(v), 1)
        if iterations % int(v):
          raise ValueError(f"--sweep_values: --iterations={iterations} must be a multiple of "
                           f"every p, got p={int(v)}")
      else:
        common.check_real("sweep_values", v, low=0.0)
        _check_rate("sweep_values", v, eta)
    if sweep == "p":
      values = tuple(int(v) for v in values)
  return {"workdir": common.check_workdir(workdir), "algorithms": algorithms,
          "iterations": iterations, "p": p, "eta": eta, "beta": beta, "alpha": alpha,
          "gamma": gamma, "bsgd_lr": bsgd_lr, "scgd_lr": scgd_lr, "scgd_gamma": scgd_gamma,
          "moml_lr": moml_lr, "moml_beta": moml_beta, "inner_lr": inner_lr,
          "inner_steps": inner_steps, "first_order": first_order, "hidden": hidden,
          "num_clients": num_clients, "tasks_per_step": tasks_per_step, "shots": shots,
          "query_shots": query_shots, "test_tasks": test_tasks,
          "episodes_per_client": episodes_per_client, "eval_every": eval_every,
          "seeds": seeds, "sweep": sweep, "sweep_values": values, "progress": progress,
          **common.checkpoint_config(checkpoint_every, resume)}


def _check_rate(name, value, eta):
  if not 0 < value * eta < 1:
    raise ValueError(f"--{name} times --eta must lie in (0, 1) (Local-SCGDM's moving "
                     f"averages), got {name}={value!r}, eta={eta!r}")


def runs(config) -> List[Dict[str, Any]]:
  """The runs the config asks for: label, algorithm, and its hyperparameters."""
  base = {k: config[k] for k in ("p", "eta", "beta", "alpha", "gamma")}
  if config["sweep"] == "none":
    return [{"label": a, "algorithm": a, **base} for a in config["algorithms"]]
  key = config["sweep"]
  return [{"label": f"local_scgdm_{key}={v:g}", "algorithm": "local_scgdm", **base, key: v}
          for v in config["sweep_values"]]


def make_algorithm(spec, config):
  name, p = spec["algorithm"], spec["p"]
  if name == "local_scgdm":
    return fedco.local_scgdm(spec["eta"], p, beta=spec["beta"], alpha=spec["alpha"],
                             gamma=spec["gamma"])
  if name == "local_bsgd":
    return fedco.comfedl(config["bsgd_lr"], p)
  if name == "local_scgd":
    return fedco.local_scgd(config["scgd_lr"], p, gamma=config["scgd_gamma"])
  return local_moml(config["moml_lr"], p, beta=config["moml_beta"])


def _episode(arrays):
  return {k: jnp.asarray(v) for k, v in arrays.items() if k not in ("amplitude", "phase")}


def run(workdir, **kwargs) -> Dict[str, Any]:
  """Runs E3 (or an ablation) and writes the outputs; returns the summary."""
  start = time.perf_counter()
  config = validate(workdir, **kwargs)
  wd = common.Workdir(config["workdir"])
  wd.write_config(config)
  common.start_checkpoints(wd, config)
  model = MLP(hidden=config["hidden"], out=1)
  meta = MAML(model.apply, config["inner_lr"], config["inner_steps"], config["first_order"])
  problem = meta.problem("sinusoid_maml")
  test = _episode(sinusoid_data.unseen_tasks(TEST_SEED, num_tasks=config["test_tasks"],
                                             shots=config["shots"],
                                             query_shots=config["query_shots"]))

  records, finals, fitted = [], {}, {}
  for seed in config["seeds"]:
    fed, tasks = sinusoid_data.federated(
        seed, num_clients=config["num_clients"],
        episodes_per_client=config["episodes_per_client"], shots=config["shots"],
        query_shots=config["query_shots"], tasks_per_step=config["tasks_per_step"])
    train_eval = _episode(sinusoid_data.training_eval_episode(
        tasks, TEST_SEED, shots=config["shots"], query_shots=config["query_shots"]))
    params = init_mlp(model, 1, seed)

    def metrics_fn(w, train_eval=train_eval):
      return {"train_mse": jnp.mean(meta.adapted_losses(w, train_eval)),
              "val_mse": jnp.mean(meta.adapted_losses(w, test)),
              "val_mse_before": jnp.mean(meta.adapted_losses(w, test, steps=0))}

    for spec in runs(config):
      algorithm = make_algorithm(spec, config)
      rounds = config["iterations"] // spec["p"]
      eval_every = max(1, min(config["eval_every"] * config["p"] // spec["p"], rounds))
      t0 = time.perf_counter()
      try:
        result = fedco.simulate(problem, algorithm, fed, params, rounds=rounds, seed=seed,
                                batch_size=1, evaluate=False, eval_every=eval_every,
                                metrics_fn=metrics_fn, progress=config["progress"],
                                **common.checkpoint_args(config, f"{spec['label']}-seed{seed}",
                                                         **spec, seed=seed))
      except fedco.runtime.NonFiniteError as err:  # report a diverged run, keep the others
        finals.setdefault(spec["label"], {})[seed] = {"diverged": str(err),
                                                      "diverged_round": err.round}
        records.extend(_records(err.metrics, spec, seed, True))
        continue
      m = result.metrics
      recs = _records(m, spec, seed, False)
      if not m["evaluated"][-1]:  # always report the last round
        last = jax.device_get(jax.jit(metrics_fn)(result.params))
        recs.append({"round": rounds, "iteration": rounds * spec["p"],
                     "algorithm": spec["label"], "seed": seed,
                     **{k: float(v) for k, v in last.items()}})
      records.extend(recs)
      tail = [r for r in recs if r["iteration"] > 0.8 * config["iterations"]] or recs[-1:]
      final = {"train_mse": recs[-1]["train_mse"], "val_mse": recs[-1]["val_mse"],
               "val_mse_before": recs[-1]["val_mse_before"],
               "val_mse_tail": float(np.mean([r["val_mse"] for r in tail])),
               "train_mse_tail": float(np.mean([r["train_mse"] for r in tail])),
               "seconds": time.perf_counter() - t0}
      if not all(np.isfinite(v) for v in final.values()):
        final["diverged"] = "non-finite final metrics"
      finals.setdefault(spec["label"], {})[seed] = final
      if seed == config["seeds"][0]:
        fitted[spec["label"]] = result.params
  wd.append_metrics(records)
  summary = summarize(finals, config)
  summary["wall_seconds"] = time.perf_counter() - start
  plot_curves(wd, records, config)
  plot_fit(wd, fitted, meta, config)
  wd.write_summary(summary)
  if config["progress"]:
    print(common.format_table(summary["table"]))
    print(f"wall time {summary['wall_seconds']:.1f} s")
  return summary


def _records(metrics, spec, seed, finite_only):
  """MSE records per evaluated round; a run counts as diverged once train or val MSE is not
  finite."""
  return common.evaluated_records(
      metrics, lambda rnd: {"iteration": rnd * spec["p"], "algorithm": spec["label"],
                            "seed": seed},
      keys=("train_mse", "val_mse", "val_mse_before"), finite_keys=("train_mse", "val_mse"),
      finite_only=finite_only)


def summarize(finals, config) -> Dict[str, Any]:
  per_algorithm, table = common.seed_statistics(
      finals, ("val_mse", "train_mse", "val_mse_tail", "val_mse_before"),
      std_in_table=("val_mse",))
  summary = {"sweep": config["sweep"], "iterations": config["iterations"],
             "seeds": list(config["seeds"]), "algorithms": per_algorithm, "table": table}
  if "local_scgdm" in finals:
    for other in ("local_bsgd", "local_scgd", "local_moml"):
      if other in finals:
        summary[f"scgdm_val_below_{other}"] = {
            seed: (finals["local_scgdm"].get(seed, {}).get("val_mse", float("nan"))
                   < finals[other].get(seed, {}).get("val_mse", float("nan")))
            for seed in config["seeds"]}
  return summary


def plot_curves(wd, records, config):
  fig = common.figure(figsize=(10, 4))
  axes = fig.subplots(1, 2)
  for ax, key, title in zip(axes, ("train_mse", "val_mse"),
                            ("training tasks", "unseen test tasks")):
    common.plot_mean_curves(ax, records, key, x="iteration", band=0.15, label_names=LABELS)
    ax.set_xlabel("meta-iteration")
    ax.set_ylabel("post-adaptation MSE")
    ax.set_title(f"sinusoid: {title}")
    ax.grid(alpha=0.3)
  common.save_with_legend(wd, fig, axes[0], "mse.png", legend=bool(records))


def plot_fit(wd, fitted, meta, config):
  """The paper's Fig. 1 task, fitted from ``shots`` support points, before/after adapting."""
  amplitude, phase = FIT_TASK
  rng = np.random.default_rng(TEST_SEED)
  sx, sy = sinusoid_data.draw_points(rng, np.float32(amplitude), np.float32(phase),
                                     config["shots"])
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
  for label, params in fitted.items():
    before, after = curves(params, sx, sy, grid)
    line, = ax.plot(grid[:, 0], after, label=f"{LABELS.get(label, label)} (adapted)")
    ax.plot(grid[:, 0], before, "--", color=line.get_color(), alpha=0.6)
  ax.set_title(f"unseen task y = {amplitude:g} sin(x + {phase:g} pi/5); dashed: before "
               f"{config['inner_steps']} step(s) at lr {config['inner_lr']:g}", fontsize=8)
  ax.set_xlabel("x")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  wd.save_figure(fig, "fit.png")


def main(argv):
  del argv
  common.quiet_logs()
  try:
    run(FLAGS.workdir, algorithms=FLAGS.algorithms, iterations=FLAGS.iterations, p=FLAGS.p,
        eta=FLAGS.eta, beta=FLAGS.beta, alpha=FLAGS.alpha, gamma=FLAGS.gamma,
        bsgd_lr=FLAGS.bsgd_lr, scgd_lr=FLAGS.scgd_lr, scgd_gamma=FLAGS.scgd_gamma,
        moml_lr=FLAGS.moml_lr, moml_beta=FLAGS.moml_beta, inner_lr=FLAGS.inner_lr,
        inner_steps=FLAGS.inner_steps, first_order=FLAGS.first_order, hidden=FLAGS.hidden,
        num_clients=FLAGS.num_clients, tasks_per_step=FLAGS.tasks_per_step,
        shots=FLAGS.shots, query_shots=FLAGS.query_shots, test_tasks=FLAGS.test_tasks,
        episodes_per_client=FLAGS.episodes_per_client, eval_every=FLAGS.eval_every,
        seeds=FLAGS.seeds, sweep=FLAGS.sweep, sweep_values=FLAGS.sweep_values,
        progress=FLAGS.progress,
        checkpoint_every=FLAGS.checkpoint_every, resume=FLAGS.resume)
  except ValueError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
