r"""Round time of each Byzantine-robust aggregation rule against plain averaging (issue 48).

The logistic workload of ``benchmarks/_common.py`` (multinomial logistic regression 784 ->
10, 7,850 parameters, synthetic MNIST-shaped data), FedAvg with 5 local steps of batch 32,
``C`` clients a round (default 100 and 1,000, every client every round). One
``fedco.Simulator(..., evaluate=False)`` per rule (``aggregation=``; the plain side has
none), each warmed up once, then ``--repeats`` timed ``run`` calls of ``--rounds`` rounds
alternate between all sides, so drift on a shared machine hits them alike. Reported per
size: each side's median ms per round and its ratio to the plain side's
(``over_plain``, measured in this one run), and whether its final model is finite.

What the ratio measures: the rule's work (sorts of ``C`` values per coordinate for the
median and trimmed mean; Krum's ``C x C`` Gram matrix and a sort per row; centered
clipping's norms) against the round's local training, which dominates at this model size.

Run::

    python -m benchmarks.byzantine --out=benchmarks/results/byzantine.json
"""

from __future__ import annotations

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results/byzantine.json", "Where to write the JSON.")
flags.DEFINE_list("sizes", ["100", "1000"], "Clients per round (every client every round).")
flags.DEFINE_integer("examples_per_client", 40, "Examples per client.")
flags.DEFINE_integer("rounds", 3, "Rounds per timed run call.")
flags.DEFINE_integer("repeats", 5, "Timed run calls per side; the median is reported.")


def rules(clients: int):
  from fedco import byzantine

  f = max(1, clients // 10)
  return {
    "plain": None,
    "mean": byzantine.mean(),
    "coordinate_median": byzantine.coordinate_median(),
    "trimmed_mean_0.1": byzantine.trimmed_mean(0.1),
    "krum": byzantine.krum(f),
    "multi_krum": byzantine.multi_krum(f, clients - f),
    "centered_clipping": byzantine.centered_clipping(1.0, 3),
  }


def measure(clients: int):
  import jax
  import jax.numpy as jnp

  import fedco
  from benchmarks import _common

  examples, rows = _common.make_data(clients, FLAGS.examples_per_client, seed=0)
  data = fedco.FederatedData.from_index_lists(examples, rows)
  problem, algorithm = _common.make_problem_and_algorithm("fedavg", local_steps=5)
  params = _common.init_params(0)
  sides, sims = {}, {}
  for name, rule in rules(clients).items():
    sim = fedco.Simulator(problem, algorithm, data, evaluate=False, batch_size=32, aggregation=rule)
    state = {"s": sim.init(params, 0)}

    def call(sim=sim, state=state):
      state["s"], _ = sim.run(state["s"], FLAGS.rounds)
      jax.block_until_ready(state["s"].server)

    sides[name], sims[name] = call, state
  timed = _common.alternate(sides, FLAGS.repeats)
  plain = timed["plain"]["median_seconds"]
  out = {}
  for name, t in timed.items():
    final = sims[name]["s"].server["params"]
    out[name] = {
      **t,
      "ms_per_round": 1e3 * t["median_seconds"] / FLAGS.rounds,
      "over_plain": t["median_seconds"] / plain,
      "final_params_finite": _common.finite(final),
      "final_mean_loss": float(_common.mean_loss(final, jax.tree.map(jnp.asarray, examples))),
    }
  return out


def main(argv):
  del argv
  from benchmarks import _common

  result = {
    "benchmark": "byzantine",
    "workload": "FedAvg on the logistic workload (784 -> 10), 5 local steps of batch 32, "
    f"{FLAGS.examples_per_client} examples a client, every client every round",
    "machine": _common.machine_info(),
    "started": _common.timestamp(),
    "rounds_per_call": FLAGS.rounds,
    "repeats": FLAGS.repeats,
    "sizes": {},
  }
  for size in FLAGS.sizes:
    result["sizes"][size] = measure(int(size))
    print(size, {k: round(v["over_plain"], 3) for k, v in result["sizes"][size].items()})
  result["load_average_end"] = _common.load_average()
  result["finished"] = _common.timestamp()
  _common.write_json(FLAGS.out, result)


if __name__ == "__main__":
  app.run(main)
