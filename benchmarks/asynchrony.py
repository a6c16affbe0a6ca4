r"""What buffered asynchronous aggregation costs per server step (issue 49, decision 112).

The logistic workload of ``benchmarks/_common.py`` (multinomial logistic regression 784 ->
10, synthetic MNIST-shaped data, ``--clients`` clients), FedAvg with 5 local steps of batch
32 and a buffer of ``m`` clients: a synchronous round of ``m`` clients (``delays=``: the
clock only) against a FedBuff server step (``asynchronous=Buffered(concurrency)``: the
``m`` earliest reports from the ring's models, the replacements dispatched), both of ``m``
clients' local training. Each side's ``fedco.Simulator(..., evaluate=False)`` is warmed up
once, then ``--repeats`` timed ``run`` calls of ``--rounds`` rounds alternate, so drift on a
shared machine hits them alike. Reported: each side's median ms per round and FedBuff's
ratio to the synchronous round (``over_synchronous``, measured in this one run), for each
``concurrency``.

What the ratio measures: the event order (a ``top_k`` over the clients in flight), the
gather of each client's starting model from the ring (``max_staleness + 1`` models), the
replacement draw (a ``top_k`` over all clients) and the ring's write, against the local
training, which is the same on both sides.

Run::

    python -m benchmarks.asynchrony --out=benchmarks/results/asynchrony.json
"""

from __future__ import annotations

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results/asynchrony.json", "Where to write the JSON.")
flags.DEFINE_integer("clients", 1000, "Clients in all.")
flags.DEFINE_integer("buffer", 10, "Clients a round (the buffer).")
flags.DEFINE_list("concurrency", ["30", "100"], "FedBuff's clients in flight.")
flags.DEFINE_integer("examples_per_client", 40, "Examples per client.")
flags.DEFINE_integer("rounds", 20, "Rounds per timed run call.")
flags.DEFINE_integer("repeats", 5, "Timed run calls per side; the median is reported.")


def measure():
  import jax

  import fedco
  from benchmarks import _common

  examples, rows = _common.make_data(FLAGS.clients, FLAGS.examples_per_client, seed=0)
  data = fedco.FederatedData.from_index_lists(examples, rows)
  problem, algorithm = _common.make_problem_and_algorithm("fedavg", local_steps=5)
  params = _common.init_params(0)
  delays = fedco.runtime.Delays(spread=0.5, jitter=0.25, straggler_fraction=0.1)
  options = {"synchronous": None}
  options.update({f"fedbuff_c{c}": fedco.runtime.Buffered(int(c)) for c in FLAGS.concurrency})
  sides, states = {}, {}
  for name, buffered in options.items():
    sim = fedco.Simulator(
      problem,
      algorithm,
      data,
      evaluate=False,
      batch_size=32,
      clients_per_round=FLAGS.buffer,
      delays=delays,
      asynchronous=buffered,
    )
    state = {"s": sim.init(params, 0)}

    def call(sim=sim, state=state):
      state["s"], _ = sim.run(state["s"], FLAGS.rounds)
      jax.block_until_ready(state["s"].server)

    sides[name], states[name] = call, state
  timed = _common.alternate(sides, FLAGS.repeats)
  base = timed["synchronous"]["median_seconds"]
  out = {}
  for name, t in timed.items():
    s = states[name]["s"]
    out[name] = {
      **t,
      "ms_per_round": 1e3 * t["median_seconds"] / FLAGS.rounds,
      "over_synchronous": t["median_seconds"] / base,
      "simulated_time_per_round": float(s.timing.clock) / int(s.round),
      "final_params_finite": _common.finite(s.server["params"]),
    }
  return out


def main(argv):
  del argv
  from benchmarks import _common

  result = {
    "benchmark": "asynchrony",
    "workload": "FedAvg on the logistic workload (784 -> 10), 5 local steps of batch 32, "
    f"{FLAGS.examples_per_client} examples a client, {FLAGS.clients} clients, "
    f"{FLAGS.buffer} a round (FedBuff's buffer)",
    "machine": _common.machine_info(),
    "started": _common.timestamp(),
    "rounds_per_call": FLAGS.rounds,
    "repeats": FLAGS.repeats,
    "sides": measure(),
  }
  print({k: round(v["over_synchronous"], 3) for k, v in result["sides"].items()})
  result["load_average_end"] = _common.load_average()
  result["finished"] = _common.timestamp()
  _common.write_json(FLAGS.out, result)


if __name__ == "__main__":
  app.run(main)
