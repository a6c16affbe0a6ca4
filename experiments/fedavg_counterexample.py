r"""E7: FedAvg for compositional problems fails; FedDRO converges (paper 004, Theorem 4.1).

The project's own instance: two clients, one-dimensional ``x``, no noise::

    g_1(x) = x + 2,    g_2(x) = 3x - 6,    f(y) = y^2 / 2,
    Phi(x) = f((g_1(x) + g_2(x)) / 2) = (2x - 2)^2 / 2,    unique stationary point x* = 1.

Each client holds one example ``{"a", "b"}`` with ``g(x; e) = a x + b`` and every step uses
the client's whole data (``batch_size=None``), so the runs are deterministic. With ``I > 1``
FedAvg Case I (``y_k = g_k(x_bar)`` after averaging) and Case II (``y_k = y_bar``) settle at
a point that is not ``x*`` (Case I runs local GD on ``f(g_k(x))``, whose minimisers -2 and 2
differ); modified FedAvg (``y_k = y_bar`` every step) and FedDRO reach ``x* = 1``. Without
noise FedDRO's hybrid tracker equals ``mean_k g_k(x_k)`` exactly, so its iterates coincide
with modified FedAvg's. (Case I also misses ``x*`` at ``I = 1``: it then follows the gradient
of ``mean_k f(g_k(x))`` and stops at 1.6; Case II at ``I = 1`` is modified FedAvg.)

Per round and algorithm it records ``|x_bar - x*|`` and the exact ``|Phi'(x_bar)|``; the
model average exists only at round ends, so the x axis is in steps ``round * I``.

    python -m experiments.fedavg_counterexample --workdir=/tmp/e7

Writes ``config.json``, ``metrics.jsonl``, ``summary.json`` and ``distance.png`` into the
workdir (see :mod:`experiments.common`) and prints a table of final distances.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Sequence, Union

from absl import app
from absl import flags
import jax.numpy as jnp
import numpy as np

import fedco
from experiments import common

# (a_k, b_k) of g_k(x) = a_k x + b_k; x* solves mean_k g_k(x) = 2x - 2 = 0.
CLIENTS = ((1.0, 2.0), (3.0, -6.0))
X_STAR = 1.0
CONVERGED_BELOW = 1e-3

ALGORITHMS = ("fedavg_co_case1", "fedavg_co_case2", "fedavg_co_modified", "feddro")
LABELS = {"fedavg_co_case1": "FedAvg Case I", "fedavg_co_case2": "FedAvg Case II",
          "fedavg_co_modified": "modified FedAvg", "feddro": "FedDRO"}
# Modified FedAvg and FedDRO coincide on this noiseless instance; dashes keep both visible.
STYLES = {"fedavg_co_case1": "-", "fedavg_co_case2": "-", "fedavg_co_modified": "-",
          "feddro": "--"}

FLAGS = flags.FLAGS


def define_flags():
  """Defines this binary's flags; called only when run as a program, so importing the module
  (tests, other experiments) never touches the global flag registry."""
  flags.DEFINE_string("workdir", None, "Output directory (created if missing).")
  flags.DEFINE_float("learning_rate", 0.02, "Local step size eta > 0 (all algorithms).")
  flags.DEFINE_integer("local_steps", 5, "Local steps per round I >= 1.")
  flags.DEFINE_integer("rounds", 400, "Communication rounds >= 1.")
  flags.DEFINE_float("beta", 0.5, "FedDRO hybrid-tracker beta in (0, 1].")
  flags.DEFINE_float("x0", 0.0, "Initial model x_bar_0.")
  flags.DEFINE_list("algorithms", list(ALGORITHMS),
                    f"Comma list from {', '.join(ALGORITHMS)}.")
  flags.DEFINE_bool("progress", True, "Print a progress line per algorithm.")
  common.define_checkpoint_flags(100)


def problem() -> fedco.Problem:
  """The global-inner problem ``f(mean_k g_k(x))`` with ``g(x; e) = a x + b``."""
  return fedco.global_inner(lambda x, e: e["a"] * x + e["b"], lambda y: 0.5 * y ** 2,
                            name="fedavg_counterexample")


def data() -> fedco.FederatedData:
  """One example per client: ``{"a": [a_k], "b": [b_k]}``."""
  return fedco.FederatedData.from_clients(
      [{"a": np.array([a], np.float32), "b": np.array([b], np.float32)} for a, b in CLIENTS])


def make_algorithm(name: str, learning_rate: float, local_steps: int, beta: float):
  if name == "feddro":
    return fedco.feddro(learning_rate, local_steps, beta=beta)
  case = {"fedavg_co_case1": "I", "fedavg_co_case2": "II", "fedavg_co_modified": "modified"}
  return fedco.fedavg_co(learning_rate, local_steps, case=case[name])


def validate(workdir, *, learning_rate=0.02, local_steps=5, rounds=400, beta=0.5, x0=0.0,
             algorithms: Union[str, Sequence[str]] = ALGORITHMS) -> Dict[str, Any]:
  """The checked configuration, or ``ValueError`` naming the bad flag."""
  return {
      "workdir": common.check_workdir(workdir),
      "learning_rate": common.check_real("learning_rate", learning_rate, low=0.0),
      "local_steps": common.check_int("local_steps", local_steps, 1),
      "rounds": common.check_int("rounds", rounds, 1),
      "beta": common.check_real("beta", beta, low=0.0, high=1.0),
      "x0": common.check_real("x0", x0),
      "algorithms": list(common.check_names("algorithms", algorithms, ALGORITHMS)),
  }


def run(workdir, *, learning_rate=0.02, local_steps=5, rounds=400, beta=0.5, x0=0.0,
        algorithms: Union[str, Sequence[str]] = ALGORITHMS, progress: bool = False,
        verbose: bool = True, checkpoint_every: int = 100, resume: bool = True
        ) -> Dict[str, Any]:
  """Run E7 and write its outputs into ``workdir``; returns the summary dict.

  Raises:
    ValueError: a bad argument (the message names the flag); nothing is written then.
    FloatingPointError: an algorithm diverged (too large a learning rate).
  """
  config = validate(workdir, learning_rate=learning_rate, local_steps=local_steps,
                    rounds=rounds, beta=beta, x0=x0, algorithms=algorithms)
  config.update(common.checkpoint_config(checkpoint_every, resume))
  wd = common.Workdir(config["workdir"])
  wd.write_config(config)
  common.start_checkpoints(wd, config)
  prob, fed = problem(), data()
  steps = np.arange(1, config["rounds"] + 1) * config["local_steps"]
  curves, finals = {}, {}
  for name in config["algorithms"]:
    alg = make_algorithm(name, config["learning_rate"], config["local_steps"], config["beta"])
    try:
      result = fedco.simulate(prob, alg, fed, jnp.asarray(config["x0"], jnp.float32),
                              rounds=config["rounds"], batch_size=None, exact_grad_norm=True,
                              metrics_fn=lambda x: {"x": x}, progress=progress,
                              **common.checkpoint_args(config, name, algorithm=name))
    except FloatingPointError as e:
      raise FloatingPointError(f"{name} diverged: {e}") from None
    x = np.asarray(result.metrics["x"], np.float64)
    distance = np.abs(x - X_STAR)
    grad_norm = np.asarray(result.metrics["grad_norm"], np.float64)
    wd.append_metrics({"round": r + 1, "step": int(steps[r]), "algorithm": name,
                       "distance": distance[r], "grad_norm": grad_norm[r]}
                      for r in range(config["rounds"]))
    curves[name] = distance
    finals[name] = {"x": x[-1], "distance": distance[-1], "grad_norm": grad_norm[-1],
                    "seconds": result.seconds}

  fig = common.figure(figsize=(6.4, 4.2))
  ax = fig.add_subplot()
  for name, distance in curves.items():
    d = np.concatenate([[abs(config["x0"] - X_STAR)], distance])
    ax.plot(np.concatenate([[0], steps]), np.where(d > 0, d, np.nan), STYLES[name],
            label=LABELS[name])
  ax.axhline(CONVERGED_BELOW, color="gray", linestyle=":", linewidth=1)
  ax.set_yscale("log")
  ax.set_xlabel(f"local steps (round x I, I = {config['local_steps']})")
  ax.set_ylabel(r"$|\bar{x} - x^*|$")
  ax.set_title("E7: two-client counterexample, Phi(x) = (2x-2)^2/2, x* = 1")
  ax.legend()
  wd.save_figure(fig, "distance.png")

  summary = {
      "experiment": "fedavg_counterexample",
      "x_star": X_STAR,
      "rounds": config["rounds"],
      "steps": int(steps[-1]),
      "converged_below": CONVERGED_BELOW,
      "final_distance": {n: f["distance"] for n, f in finals.items()},
      "final_grad_norm": {n: f["grad_norm"] for n, f in finals.items()},
      "final_x": {n: f["x"] for n, f in finals.items()},
      "converged": {n: bool(f["distance"] < CONVERGED_BELOW) for n, f in finals.items()},
      "seconds": {n: f["seconds"] for n, f in finals.items()},
  }
  wd.write_summary(summary)
  summary = common.to_jsonable(summary)
  if verbose:
    rows = [{"algorithm": n, "final x": f["x"], "|x - x*|": f["distance"],
             "|Phi'(x)|": f["grad_norm"], "converged": summary["converged"][n]}
            for n, f in finals.items()]
    print(f"E7 after {config['rounds']} rounds ({summary['steps']} steps), x* = {X_STAR:g}")
    print(common.format_table(rows))
    print(f"outputs in {wd.path}")
  return summary


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  common.quiet_logs()
  try:
    run(FLAGS.workdir, learning_rate=FLAGS.learning_rate, local_steps=FLAGS.local_steps,
        rounds=FLAGS.rounds, beta=FLAGS.beta, x0=FLAGS.x0, algorithms=FLAGS.algorithms,
        progress=FLAGS.progress, checkpoint_every=FLAGS.checkpoint_every, resume=FLAGS.resume)
  except (ValueError, FloatingPointError) as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
