r"""Where fedco's time goes against the centralized step: FedAvg at K = 10 and 1,000 clients.

Four jitted programs of the same FedAvg arithmetic (logistic regression 784 -> 10, 5 local
steps of batch 32 per client, lr 0.05), each a ``lax.scan``; their timed calls alternate:

1. ``fedco``: ``fedco.Simulator(..., evaluate=False).run``;
2. ``handwritten``: the smallest hand-written federated program: per round, broadcast the
   model to ``K`` client copies, scan 5 steps of ``vmap``-ed (``randint`` batch draw, gather,
   ``jax.grad``, SGD), then average. No plan, ledger, sampling or ``optax``;
3. ``vmap_compute``: only the per-client compute: ``vmap(grad)`` over ``K`` client models on
   fixed batches (no RNG, no gather, no averaging);
4. ``one_model``: the same examples as ONE model's batch of ``K * 32`` (no RNG, no gather):
   the centralized step's compute.

``fedco / handwritten`` is fedco's runtime overhead; ``vmap_compute / one_model`` is what
keeping ``K`` separate models costs on this backend whatever the library.

Run::

    python -m benchmarks.vmap_floor --out=benchmarks/results/vmap_floor.json
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import fedco
from benchmarks import _common as C

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results/vmap_floor.json", "Where to write the JSON.")
flags.DEFINE_list("sizes", ["10", "1000"], "Client counts K.")
flags.DEFINE_list("examples_per_client", ["600", "60"], "Examples per client, one per size.")
flags.DEFINE_list("rounds", ["50", "1"], "Rounds per call, one per size.")
flags.DEFINE_integer("repeats", 5, "Timed calls per program (median).")
flags.DEFINE_integer("seed", 0, "Seed.")

TAU, BATCH, LR = 5, 32, 0.05


def _ce_batch(p, x, y):
  logits = x @ p["w"].T + p["b"]
  return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, y[:, None], 1)[:, 0])


def programs(k, n, rounds, seed):
  host, rows = C.make_data(k, n, seed)
  data = fedco.FederatedData.from_index_lists(host, rows)
  del host
  params = C.init_params(seed)
  problem, algorithm = C.make_problem_and_algorithm("fedavg", TAU)
  sim = fedco.Simulator(problem, algorithm, data, batch_size=BATCH, evaluate=False)
  ex, index = data.examples, data.index
  state = {"sim": sim.init(params, seed), "hand": (params, jax.random.PRNGKey(seed + 1))}

  @jax.jit
  def hand(params, key):
    def one_round(carry, _):
      params, key = carry
      key, kr = jax.random.split(key)
      models = jax.tree.map(lambda a: jnp.broadcast_to(a, (k,) + a.shape), params)

      def step(models, t):
        keys = jax.random.split(jax.random.fold_in(kr, t), k)

        def client(p, key, irow):
          r = irow[jax.random.randint(key, (BATCH,), 0, n)]
          g = jax.grad(_ce_batch)(p, ex["x"][r], ex["y"][r])
          return jax.tree.map(lambda a, b: a - LR * b, p, g)

        return jax.vmap(client)(models, keys, index), None

      models, _ = jax.lax.scan(step, models, jnp.arange(TAU))
      return (jax.tree.map(lambda a: a.mean(0), models), key), None

    return jax.lax.scan(one_round, (params, key), None, length=rounds)[0]

  # fixed batches for the compute-only programs: the first 32 rows of every client
  xb = ex["x"][index[:, :BATCH] if n >= BATCH else index[:, np.arange(BATCH) % n]]
  yb = ex["y"][index[:, :BATCH] if n >= BATCH else index[:, np.arange(BATCH) % n]]
  steps = rounds * TAU

  @jax.jit
  def vmap_compute(models):
    def body(models, _):
      g = jax.vmap(jax.grad(_ce_batch))(models, xb, yb)
      return jax.tree.map(lambda a, b: a - LR * b, models, g), None

    return jax.lax.scan(body, models, None, length=steps)[0]

  xc, yc = xb.reshape(k * BATCH, -1), yb.reshape(k * BATCH)

  @jax.jit
  def one_model(p):
    def body(p, _):
      g = jax.grad(_ce_batch)(p, xc, yc)
      return jax.tree.map(lambda a, b: a - LR * b, p, g), None

    return jax.lax.scan(body, p, None, length=steps)[0]

  models = jax.tree.map(lambda a: jnp.broadcast_to(a, (k,) + a.shape), params)

  def run_sim():
    state["sim"], m = sim.run(state["sim"], rounds)
    jax.block_until_ready((state["sim"], m))

  def run_hand():
    state["hand"] = jax.block_until_ready(hand(*state["hand"]))

  return {
    "fedco": run_sim,
    "handwritten": run_hand,
    "vmap_compute": lambda: jax.block_until_ready(vmap_compute(models)),
    "one_model": lambda: jax.block_until_ready(one_model(params)),
  }


def main(argv):
  del argv
  machine = C.machine_info()
  results = {}
  for k, n, r in zip(
    *(list(map(int, v)) for v in (FLAGS.sizes, FLAGS.examples_per_client, FLAGS.rounds))
  ):
    timed = C.alternate(programs(k, n, r, FLAGS.seed), FLAGS.repeats)
    rec = {
      "clients": k,
      "examples_per_client": n,
      "rounds_per_call": r,
      "load_average_end": C.load_average(),
    }
    for label, t in timed.items():
      t["us_per_client_step"] = 1e6 * t["median_seconds"] / (k * TAU * r)
      rec[label] = t
    med = {label: t["median_seconds"] for label, t in timed.items()}
    rec["fedco_over_handwritten"] = med["fedco"] / med["handwritten"]
    rec["vmap_compute_over_one_model"] = med["vmap_compute"] / med["one_model"]
    rec["fedco_over_one_model"] = med["fedco"] / med["one_model"]
    results[str(k)] = rec
  out = {
    "benchmark": "vmap_floor",
    "timestamp": C.timestamp(),
    "config": {
      "algorithm": "fedavg",
      "lr": LR,
      "local_steps": TAU,
      "batch_size": BATCH,
      "model": {"w": [C.NUM_CLASSES, 784], "b": [C.NUM_CLASSES]},
      "sizes": FLAGS.sizes,
      "examples_per_client": FLAGS.examples_per_client,
      "rounds_per_call": FLAGS.rounds,
      "repeats": FLAGS.repeats,
      "statistic": "median over repeats; the four programs alternate",
    },
    "machine": machine,
    "load_average_end": C.load_average(),
    "results": results,
  }
  C.write_json(FLAGS.out, out)
  lines = [
    "| K | fedco | handwritten | vmap compute | one model | fedco / handwritten "
    "| vmap compute / one model |",
    "|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for k, rec in results.items():
    lines.append(
      f"| {k} | "
      + " | ".join(
        f"{rec[l]['us_per_client_step']:.1f}"
        for l in ("fedco", "handwritten", "vmap_compute", "one_model")
      )
      + f" | {rec['fedco_over_handwritten']:.2f}x "
      f"| {rec['vmap_compute_over_one_model']:.2f}x |"
    )
  print("(microseconds per client-step of 32 examples)")
  print("\n".join(lines))
  print(f"\nwrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
