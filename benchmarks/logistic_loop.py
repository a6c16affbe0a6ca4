r"""Rounds per second: fedco's one-program simulator against a per-client Python loop.

Workload (the issue's target: fedco >= 10x the rounds/s of the loop):

* 10 clients, 5 local steps per round, batch 32 per client per step;
* multinomial logistic regression 784 -> 10, params ``{"w": [10, 784], "b": [10]}``;
* synthetic MNIST-shaped data: float32 features uniform in [0, 1], uniform random labels,
  600 examples per client (nothing is downloaded).

Algorithms (same fedco ``update`` on both sides, so the arithmetic per step is the same):

* ``fedavg``: plain FedAvg on ``fedco.problems.plain(cross_entropy)``;
* ``comfedl``: ComFedL on client-level KL-DRO ``fedco.problems.client_kl_dro(ce, gamma=0.2)``
  (local-inner, exp outer);
* ``feddro``: FedDRO on sample-level KL-DRO as a global-inner problem
  ``fedco.global_inner(lambda p, e: exp(ce(p, e) / lam), lambda y: lam * log(y))``.

The two sides:

1. fedco: ``Simulator(problem, algorithm, data, batch_size=32, evaluate=False)``; ``init``
   once, one warm-up ``run`` (compilation), then ``--repeats`` timed ``run(state, rounds)``
   calls, each ended by ``block_until_ready``; the median is reported.
2. the reference loop, written the way papers' code is: for each round, for each client and
   local step (Python loops), draw a batch with NumPy indices on the host (like a
   DataLoader), call ONE ``jax.jit``-ed single-client step (the same fedco ``update`` fed by
   ``fedco.oracle_args``), and average the client models with ``jnp`` after the round.
   FedDRO's tracker ``y`` is averaged after every step, as the algorithm requires, so its loop
   runs steps outside and clients inside. The step is compiled and warmed up before timing.

Both sides are warmed up first; their timed repeats then alternate (fedco, loop, fedco, ...)
so machine noise hits both alike, and each side's median is reported.

Each side draws the batches its algorithm actually consumes (the simulator draws inner, outer
and next-inner batches and XLA drops the unused gathers; the loop draws one batch per step
for FedAvg and ComFedL and two, ``zeta`` and ``zeta'``, for FedDRO).

Run::

    python -m benchmarks.logistic_loop --out=benchmarks/results/logistic_loop.json
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from typing import Any, Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

import fedco
import fedco.io
from benchmarks._common import (
  GAMMA,
  LAM,
  NUM_CLASSES,
  CompileCounter,
  FedcoSide,
  finite,
  init_params,
  machine_info,
  make_data,
  make_problem_and_algorithm,
  mean_loss,
)

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 50, "Timed rounds per fedco repeat (one jitted run call).")
flags.DEFINE_integer(
  "loop_rounds", 20, "Timed rounds per repeat of the per-client loop (normalised to rounds/s)."
)
flags.DEFINE_integer("repeats", 9, "Timed repeats per side; the median is reported.")
flags.DEFINE_string("out", "benchmarks/results/logistic_loop.json", "Where to write the JSON.")
flags.DEFINE_list(
  "algorithms",
  ["fedavg", "comfedl", "feddro"],
  "Comma list of algorithms: fedavg, comfedl, feddro.",
)
flags.DEFINE_integer("clients", 10, "Number of clients (all participate every round).")
flags.DEFINE_integer("local_steps", 5, "Local steps per round.")
flags.DEFINE_integer("batch_size", 32, "Examples per client per step.")
flags.DEFINE_integer("examples_per_client", 600, "Synthetic examples per client.")
flags.DEFINE_integer("seed", 0, "Seed for data, params and batches.")
flags.DEFINE_integer(
  "in_dim",
  784,
  "Input features (784 is the benchmark; smaller values show the dispatch-bound regime).",
)

TARGET = 10.0


COMPILES = CompileCounter()
# Which of the loop's per-step batches feed oracle_args' inner, outer and next-inner slots
# (0 = the first batch, 1 = the second); FedDRO's tracker refresh uses a second sample.
BATCH_ROLES = {
  "fedavg": (0, 0, 0),
  "comfedl": (0, 0, 0),
  "local_scgdm": (0, 0, 0),
  "feddro": (0, 0, 1),
}


# ---- (1) fedco --------------------------------------------------------------------------

# ---- (2) the per-client Python loop ------------------------------------------------------


def make_step(problem, algorithm, roles) -> Callable:
  """ONE client's step, jitted: the fedco update on batches passed from the host."""

  def step(params, cstate, batches):
    inner, outer, nxt = (batches[r] for r in roles)
    grad_h_fn, kwargs = fedco.oracle_args(problem, inner, outer, nxt)
    grad_h = None if grad_h_fn is None else grad_h_fn(params)
    updates, cstate = algorithm.update(grad_h, cstate, params, **kwargs)
    return optax.apply_updates(params, updates), cstate

  return jax.jit(step)


def _average(trees: List[Any]):
  return jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs), axis=0), *trees)


class LoopSide:
  """A per-client federated loop as papers' code writes it."""

  def __init__(
    self, problem, algorithm, roles, host_examples, rows, params, *, batch_size, rounds, seed
  ):
    self.host_examples = host_examples
    self.x, self.y = host_examples["x"], host_examples["y"]
    self.rows, self.batch_size, self.rounds = rows, batch_size, rounds
    self.plan = algorithm.plan
    self.num_batches = max(roles) + 1
    self.rng = np.random.default_rng(seed + 1)
    self.step = make_step(problem, algorithm, roles)
    self.server = params
    self.rounds_done = 0
    k = len(rows)
    if problem.compositional:
      inner = jax.jit(problem.inner_value)
      w = jnp.full((batch_size,), 1.0 / batch_size, jnp.float32)
      y0 = _average([inner(params, self._batch(c), w) for c in range(k)])
      # every client starts from y_bar_0, the mean of one mini-batch g_k(x_0) per client
      self.cstates = [algorithm.init(params, inner_value=y0) for _ in range(k)]
    else:
      self.cstates = [algorithm.init(params) for _ in range(k)]

  def _batch(self, client):
    """A DataLoader-style batch: NumPy indices and rows on the host."""
    rows = self.rows[client]
    idx = rows[self.rng.integers(0, rows.size, self.batch_size)]
    return {"x": self.x[idx], "y": self.y[idx]}

  def _batches(self, client):
    return tuple(self._batch(client) for _ in range(self.num_batches))

  def round(self):
    k = len(self.rows)
    if self.plan.every_step:  # FedDRO: y_bar is averaged after every step
      params = [self.server] * k
      for _ in range(self.plan.local_steps):
        for c in range(k):
          params[c], self.cstates[c] = self.step(params[c], self.cstates[c], self._batches(c))
        y_bar = _average([s.y for s in self.cstates])
        self.cstates = [s._replace(y=y_bar) for s in self.cstates]
    else:
      params = []
      for c in range(k):
        p = self.server
        for _ in range(self.plan.local_steps):
          p, self.cstates[c] = self.step(p, self.cstates[c], self._batches(c))
        params.append(p)
    self.server = _average(params)  # plain model averaging (equal client sizes here)
    self.rounds_done += 1

  def run(self):
    for _ in range(self.rounds):
      self.round()
    jax.block_until_ready(self.server)

  def final(self):
    return self.server, self.host_examples, self.rounds_done


# ---- timing -------------------------------------------------------------------------------


def bench_pair(sides: Dict[str, Any], repeats: int) -> Dict[str, Dict[str, Any]]:
  """Warms both sides up, then alternates their timed repeats so drift hits both alike."""
  first = {}
  for label, side in sides.items():
    t0 = time.perf_counter()
    side.run()  # compile + warm up (fedco: the run program; loop: the step and averaging)
    first[label] = time.perf_counter() - t0
  times = {label: [] for label in sides}
  compiles = {label: 0 for label in sides}
  for _ in range(repeats):
    for label, side in sides.items():
      before = COMPILES.count
      t0 = time.perf_counter()
      side.run()
      times[label].append(time.perf_counter() - t0)
      compiles[label] += COMPILES.count - before
  out = {}
  for label, side in sides.items():
    med = statistics.median(times[label])
    params, examples, rounds_done = side.final()
    out[label] = {
      "rounds_per_repeat": side.rounds,
      "seconds": times[label],
      "median_seconds": med,
      "rounds_per_s": side.rounds / med,
      "ms_per_round": 1e3 * med / side.rounds,
      "first_call_seconds": first[label],
      "compiles_while_timed": compiles[label],
      "rounds_run": rounds_done,
      "final_params_finite": finite(params),
      "final_mean_loss": float(mean_loss(params, examples)),
    }
  return out


# ---- reporting ----------------------------------------------------------------------------


def markdown_table(results: Dict[str, Any]) -> str:
  lines = [
    "| algorithm | fedco rounds/s | loop rounds/s | fedco / loop | >= 10x |",
    "|---|---:|---:|---:|:---:|",
  ]
  for name, r in results.items():
    lines.append(
      f"| {name} | {r['fedco']['rounds_per_s']:.1f} | {r['loop']['rounds_per_s']:.1f} "
      f"| {r['speedup']:.1f}x | {'yes' if r['speedup'] >= TARGET else 'no'} |"
    )
  return "\n".join(lines)


def main(argv):
  del argv
  for name, value in (
    ("rounds", FLAGS.rounds),
    ("loop_rounds", FLAGS.loop_rounds),
    ("repeats", FLAGS.repeats),
  ):
    if value < 1:
      raise app.UsageError(f"--{name} must be >= 1, got {value}")
  host_examples, rows = make_data(
    FLAGS.clients, FLAGS.examples_per_client, FLAGS.seed, FLAGS.in_dim
  )
  params = init_params(FLAGS.seed, FLAGS.in_dim)
  machine = machine_info()
  print(
    f"machine: {machine['platform']} | {machine['cpu_count']} CPUs | jax {machine['jax']} "
    f"| {machine['default_backend']} {machine['devices']}",
    flush=True,
  )
  results = {}
  for name in FLAGS.algorithms:
    problem, algorithm = make_problem_and_algorithm(name, FLAGS.local_steps)
    roles = BATCH_ROLES[name]
    sides = {
      "fedco": FedcoSide(
        problem,
        algorithm,
        host_examples,
        rows,
        params,
        batch_size=FLAGS.batch_size,
        rounds=FLAGS.rounds,
        seed=FLAGS.seed,
      ),
      "loop": LoopSide(
        problem,
        algorithm,
        roles,
        host_examples,
        rows,
        params,
        batch_size=FLAGS.batch_size,
        rounds=FLAGS.loop_rounds,
        seed=FLAGS.seed,
      ),
    }
    timed = bench_pair(sides, FLAGS.repeats)
    fed, loop = timed["fedco"], timed["loop"]
    speedup = fed["rounds_per_s"] / loop["rounds_per_s"]
    results[name] = {
      "problem": problem.name,
      "algorithm": algorithm.name,
      "fedco": fed,
      "loop": loop,
      "speedup": speedup,
      "meets_target": speedup >= TARGET,
    }
    print(
      f"{name}: fedco {fed['rounds_per_s']:.1f} rounds/s, loop {loop['rounds_per_s']:.1f} "
      f"rounds/s, {speedup:.1f}x",
      flush=True,
    )
  out = {
    "benchmark": "logistic_loop",
    "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "config": {
      "clients": FLAGS.clients,
      "clients_per_round": FLAGS.clients,
      "local_steps": FLAGS.local_steps,
      "batch_size": FLAGS.batch_size,
      "examples_per_client": FLAGS.examples_per_client,
      "model": {"w": [NUM_CLASSES, FLAGS.in_dim], "b": [NUM_CLASSES]},
      "fedco_rounds_per_repeat": FLAGS.rounds,
      "loop_rounds_per_repeat": FLAGS.loop_rounds,
      "repeats": FLAGS.repeats,
      "statistic": "median over repeats; fedco and loop repeats alternate",
      "evaluate": False,
      "comfedl_gamma": GAMMA,
      "feddro_lambda": LAM,
      "seed": FLAGS.seed,
      "target_speedup": TARGET,
    },
    "machine": machine,
    "results": results,
  }
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
  fedco.io.atomic_write_json(FLAGS.out, out)
  print()
  print(markdown_table(results))
  print(f"\nwrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
