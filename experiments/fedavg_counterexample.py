r"""E7: FedAvg for compositional problems fails; FedDRO converges (paper 004, Theorem 4.1).

The project's own instance: two clients, one-dimensional ``x``, no noise::

    g_1(x) = x + 2,    g_2(x) = 3x - 6,    f(y) = y^2 / 2,
    Phi(x) = f((g_1(x) + g_2(x)) / 2) = (2x - 2)^2 / 2,    unique stationary point x* = 1.

Each client holds one example ``{"a", "b"}`` with ``g(x; e) = a x + b`` and every step uses
the client's whole data (``batch_size = 0``), so the runs are deterministic (``seeds = (0,)``).
The compared methods are ``config.methods`` (every one at ``learning_rate = 0.02``,
``local_steps = 5`` (I), ``rounds = 400``, from ``x0 = 0``): with ``I > 1`` FedAvg Case I
(``fedavg_co_case1``: ``y_k = g_k(x_bar)`` after averaging) and Case II
(``fedavg_co_case2``: ``y_k = y_bar``) settle at a point that is not ``x*`` (Case I runs
local GD on ``f(g_k(x))``, whose minimisers -2 and 2 differ); modified FedAvg
(``fedavg_co_modified``: ``y_k = y_bar`` every step) and FedDRO (``feddro``, ``beta = 0.5``)
reach ``x* = 1``. Without noise FedDRO's hybrid tracker equals ``mean_k g_k(x_k)`` exactly,
so its iterates coincide with modified FedAvg's (the figure draws them with different
line styles and staggered markers). (Case I also misses ``x*`` at ``I = 1``: it then follows
the gradient of ``mean_k f(g_k(x))`` and stops at 1.6; Case II at ``I = 1`` is modified
FedAvg.)

Every ``eval_every`` rounds (default 1) a run records ``x`` (the model average), the
``distance`` ``|x_bar - x*|`` and the exact ``grad_norm`` ``|Phi'(x_bar)|`` (plus the
objective and client losses), streamed to ``metrics.jsonl`` / ``metrics.csv`` with its
``method``, ``seed`` and ``round``. The model average exists only at round ends, so the
figure's x axis is in local steps ``round * local_steps``.

    python -m experiments.main --config=experiments/configs/fedavg_counterexample.py \
        --workdir=runs/e7

Writes ``config.json``, ``metrics.jsonl``, ``metrics.csv``, ``summary.json`` (final ``x``,
distance, gradient norm and whether it is below ``1e-3``, per method) and ``distance.png``
into the workdir, and prints a table of the final values.
"""

from __future__ import annotations

from typing import Any, Dict, List

import jax.numpy as jnp
import numpy as np

import fedco
from fedco import extend
from fedco.experiment import outputs, runner

# (a_k, b_k) of g_k(x) = a_k x + b_k; x* solves mean_k g_k(x) = 2x - 2 = 0.
CLIENTS = ((1.0, 2.0), (3.0, -6.0))
X_STAR = 1.0
CONVERGED_BELOW = 1e-3
TABLE_KEYS = ("x", "distance", "grad_norm")
PROGRESS = "distance"
SEEDS_IN_ONE_PROGRAM = True  # its seeds differ only in data, model and metrics_data
TRADEOFF = {
  "bytes_up": (
    ("objective", "final objective Phi(x)", "log"),
    ("distance", "final |x - x*|", "log"),
  )
}


def problem() -> fedco.Problem:
  """The global-inner problem ``f(mean_k g_k(x))`` with ``g(x; e) = a x + b``."""
  return fedco.global_inner(
    lambda x, e: e["a"] * x + e["b"], lambda y: 0.5 * y**2, name="fedavg_counterexample"
  )


def data() -> fedco.FederatedData:
  """One example per client: ``{"a": [a_k], "b": [b_k]}``."""
  return fedco.FederatedData.from_clients(
    [{"a": np.array([a], np.float32), "b": np.array([b], np.float32)} for a, b in CLIENTS]
  )


def check(config) -> None:
  """E7's own fields (``ValueError`` naming ``--config.<field>``)."""
  if config.batch_size != 0:
    raise ValueError(
      f"--config.batch_size must be 0 (each client's whole data: its one "
      f"example) in E7, got {config.batch_size!r}"
    )
  extend.bounded("--config.x0", config.x0)


def build(config, method, seed, prepared) -> runner.Run:
  del seed, prepared
  return runner.Run(
    problem(),
    method.build(),
    data(),
    jnp.asarray(config.x0, jnp.float32),
    metrics_fn=lambda x: {"x": x, "distance": jnp.abs(x - X_STAR)},
    simulate={"exact_grad_norm": True},
    record_keys=TABLE_KEYS,
  )


def summarize(config, outcome) -> Dict[str, Any]:
  mean = lambda label, key: outcome.per_method[label][key]["mean"]
  converged = {
    label: all("diverged" not in f and f["distance"] < CONVERGED_BELOW for f in by_seed.values())
    for label, by_seed in outcome.finals.items()
  }
  for row in outcome.table:
    row["converged"] = converged[row["method"]]
  labels = list(outcome.per_method)
  return {
    "x_star": X_STAR,
    "x0": config.x0,
    "rounds": config.rounds,
    "steps": {m.label: config.rounds * m.local_steps for m in outcome.methods},
    "converged_below": CONVERGED_BELOW,
    "final_distance": {label: mean(label, "distance") for label in labels},
    "final_grad_norm": {label: mean(label, "grad_norm") for label in labels},
    "final_x": {label: mean(label, "x") for label in labels},
    "converged": converged,
  }


def report(summary) -> List[str]:
  return [f"E7 after {summary['rounds']} rounds, x* = {X_STAR:g}"]


def plot(wd, config, outcome):
  """``distance.png``: ``|x_bar - x*|`` against local steps (log scale) from ``x0``, mean +-
  std over seeds; dotted: the convergence threshold."""
  start = [  # every run's x0, before its first round
    {"method": label, "seed": seed, "round": 0, "distance": abs(config.x0 - X_STAR)}
    for label in outcome.drawn()
    for seed in outcome.seeds
  ]
  fig = outputs.curves(
    start + outcome.records,
    outcome.labels,
    [("distance", r"$|\bar{x} - x^*|$", "log")],
    title=f"E7, x* = 1 (dotted: {CONVERGED_BELOW:g}, converged)",
    x=f"local steps (round x local_steps, local_steps = {config.local_steps})",
    steps={m.label: m.local_steps for m in outcome.methods},
    finals=outcome.finals,
    hlines={"distance": CONVERGED_BELOW},
  )
  wd.save_figure(fig, "distance.png")
