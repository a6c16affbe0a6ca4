r"""Client scaling: the logistic workload with 10, 100, 1,000 and 10,000 clients.

Every client takes part in every round (``clients_per_round = K``); 5 local steps per round,
batch 32 per client per step (drawn with replacement, so clients with 20 examples still
take 32), multinomial logistic regression 784 -> 10 on synthetic MNIST-shaped data. The
examples per client shrink as ``K`` grows so the data fit in memory (default 600, 200, 60,
20: 6,000 to 200,000 examples, 19 to 627 MB of float32 features).

Algorithms: ``fedavg`` (plain FedAvg, lr 0.05) and ``feddro`` (FedDRO on sample-level KL-DRO,
lr 0.01, ``beta = 0.5``; ``y_bar`` is averaged after every step).

Each (size, algorithm) pair runs in a fresh subprocess (``--worker``), so the peak memory is
that size's own. The worker builds the data, ``fedco.Simulator(..., evaluate=False)``,
``init``, then one untimed-for-throughput first ``run`` call (compilation + one chunk) and
``--repeats`` timed calls of the same length. It records:

* client-steps per second: ``K * tau * rounds / median seconds``, and rounds per second;
* compile time: first call minus the steady median, and the sum of JAX's
  ``/jax/core/compile/*`` event durations (tracing, lowering, XLA compilation);
* peak memory: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` after each phase (data, init,
  first run, timed runs), and the bytes of live JAX arrays (``jax.live_arrays()``) after
  the runs (``memory_stats()`` is ``None`` on CPU, so there is no device peak);
* whether the final server parameters are finite.

Run::

    python -m benchmarks.client_scaling --out=benchmarks/results/client_scaling.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results/client_scaling.json", "Where to write the JSON.")
flags.DEFINE_list("sizes", ["10", "100", "1000", "10000"], "Client counts K.")
flags.DEFINE_list("examples_per_client", ["600", "200", "60", "20"],
                  "Examples per client, one per size.")
flags.DEFINE_list("rounds", ["50", "5", "1", "1"],
                  "Rounds per timed run call, one per size.")
flags.DEFINE_list("algorithms", ["fedavg", "feddro"], "Algorithms (fedavg, feddro).")
flags.DEFINE_integer("repeats", 3, "Timed run calls per size; the median is reported.")
flags.DEFINE_integer("local_steps", 5, "Local steps per round.")
flags.DEFINE_integer("batch_size", 32, "Examples per client per step.")
flags.DEFINE_integer("seed", 0, "Seed.")
flags.DEFINE_integer("timeout", 600, "Seconds per worker subprocess.")
# worker mode (one size, one algorithm, in this process)
flags.DEFINE_boolean("worker", False, "Internal: run one size in this process.")
flags.DEFINE_integer("clients", 10, "Internal (worker): K.")
flags.DEFINE_integer("per_client", 600, "Internal (worker): examples per client.")
flags.DEFINE_string("algorithm", "fedavg", "Internal (worker): the algorithm.")
flags.DEFINE_integer("worker_rounds", 1, "Internal (worker): rounds per run call.")
flags.DEFINE_string("result_file", "", "Internal (worker): where to write its JSON.")


def worker():
  import statistics

  import jax
  import jax.numpy as jnp
  import numpy as np

  import fedco
  from benchmarks import _common as C

  events = {}

  def on_event(event, duration, **kwargs):
    del kwargs
    if event.startswith("/jax/core/compile/"):
      events[event] = events.get(event, 0.0) + float(duration)

  jax.monitoring.register_event_duration_secs_listener(on_event)
  k, n, name = FLAGS.clients, FLAGS.per_client, FLAGS.algorithm
  tau, rounds = FLAGS.local_steps, FLAGS.worker_rounds
  rss = {"after_imports": C.maxrss_bytes()}
  t0 = time.perf_counter()
  host, rows = C.make_data(k, n, FLAGS.seed)
  data = fedco.FederatedData.from_index_lists(host, rows)
  data_bytes = int(sum(np.asarray(a).nbytes for a in jax.tree.leaves(data)))
  eval_examples = {key: v[: min(10000, v.shape[0])] for key, v in host.items()}
  del host, rows
  data_seconds = time.perf_counter() - t0
  rss["after_data"] = C.maxrss_bytes()
  problem, algorithm = C.make_problem_and_algorithm(name, tau)
  sim = fedco.Simulator(problem, algorithm, data, batch_size=FLAGS.batch_size, evaluate=False)
  t0 = time.perf_counter()
  state = jax.block_until_ready(sim.init(C.init_params(FLAGS.seed), FLAGS.seed))
  init_seconds = time.perf_counter() - t0
  rss["after_init"] = C.maxrss_bytes()
  state_bytes = int(sum(a.nbytes for a in jax.tree.leaves(state)))

  def run():
    nonlocal state
    state, metrics = sim.run(state, rounds)
    jax.block_until_ready((state, metrics))

  compile_before = dict(events)
  t0 = time.perf_counter()
  run()
  first = time.perf_counter() - t0
  compile_events = {e: v - compile_before.get(e, 0.0) for e, v in events.items()}
  rss["after_first_run"] = C.maxrss_bytes()
  times = []
  for _ in range(FLAGS.repeats):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  rss["after_timed_runs"] = C.maxrss_bytes()
  med = statistics.median(times)
  live = C.live_array_bytes()
  params = state.server["params"]
  result = {
      "clients": k, "examples_per_client": n, "total_examples": k * n, "algorithm": name,
      "rounds_per_call": rounds, "repeats": FLAGS.repeats, "seconds": times,
      "median_seconds": med, "rounds_per_s": rounds / med, "ms_per_round": 1e3 * med / rounds,
      "client_steps_per_s": k * tau * rounds / med,
      "us_per_client_step": 1e6 * med / (k * tau * rounds),
      "first_call_seconds": first, "compile_seconds_first_minus_steady": first - med,
      "compile_event_seconds": compile_events, "init_seconds": init_seconds,
      "data_build_seconds": data_seconds, "maxrss_bytes": rss,
      "peak_rss_gib": rss["after_timed_runs"] / 2**30,
      "live_array_bytes_after_runs": live, "federated_data_bytes": data_bytes,
      "sim_state_bytes": state_bytes,
      "rounds_run": int(state.round), "final_params_finite": C.finite(params),
      "final_mean_loss_first_10000": float(C.mean_loss(params, jax.tree.map(jnp.asarray,
                                                                             eval_examples))),
      "load_average_end": C.load_average(),
  }
  with open(FLAGS.result_file, "w") as f:
    json.dump(result, f)


def markdown_table(rows) -> str:
  lines = ["| K | examples/client | algorithm | rounds/s | client-steps/s | us/client-step "
           "| compile s (first - steady) | peak RSS GiB | live arrays MiB | finite |",
           "|---:|---:|---|---:|---:|---:|---:|---:|---:|:---:|"]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['clients']} | {r['examples_per_client']} | {r['algorithm']} "
                   f"| failed: {r['error'][:60]} | | | | | | |")
      continue
    live = r["live_array_bytes_after_runs"]
    lines.append(
        f"| {r['clients']} | {r['examples_per_client']} | {r['algorithm']} "
        f"| {r['rounds_per_s']:.2f} | {r['client_steps_per_s']:,.0f} "
        f"| {r['us_per_client_step']:.1f} | {r['compile_seconds_first_minus_steady']:.2f} "
        f"| {r['peak_rss_gib']:.2f} | {'-' if live is None else f'{live / 2**20:.0f}'} "
        f"| {'yes' if r['final_params_finite'] else 'NO'} |")
  return "\n".join(lines)


def main(argv):
  del argv
  if FLAGS.worker:
    worker()
    return
  from benchmarks import _common as C
  sizes = [int(s) for s in FLAGS.sizes]
  per = [int(s) for s in FLAGS.examples_per_client]
  rounds = [int(s) for s in FLAGS.rounds]
  if not len(sizes) == len(per) == len(rounds):
    raise app.UsageError("--sizes, --examples_per_client and --rounds need one entry each")
  for name in FLAGS.algorithms:
    if name not in ("fedavg", "feddro"):
      raise app.UsageError(f"unknown algorithm {name!r}; choose fedavg or feddro")
  machine = C.machine_info()
  print(f"machine: {machine['platform']} | {machine['cpu_model']} x{machine['cpu_count']} | "
        f"{machine['mem_total_gib']} GiB | jax {machine['jax']} | load "
        f"{machine['load_average_start']}", flush=True)
  rows = []
  for k, n, r in zip(sizes, per, rounds):
    for name in FLAGS.algorithms:
      with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "benchmarks.client_scaling", "--worker",
               f"--clients={k}", f"--per_client={n}", f"--algorithm={name}",
               f"--worker_rounds={r}", f"--repeats={FLAGS.repeats}",
               f"--local_steps={FLAGS.local_steps}", f"--batch_size={FLAGS.batch_size}",
               f"--seed={FLAGS.seed}", f"--result_file={path}"]
        load = C.load_average()
        t0 = time.perf_counter()
        try:
          proc = subprocess.run(cmd, capture_output=True, text=True, timeout=FLAGS.timeout)
          ok = proc.returncode == 0 and os.path.exists(path)
          err = "" if ok else f"rc {proc.returncode}: {proc.stderr[-2000:]}"
        except subprocess.TimeoutExpired:
          ok, err = False, f"timeout after {FLAGS.timeout} s"
        wall = time.perf_counter() - t0
        if ok:
          with open(path) as f:
            row = json.load(f)
        else:
          row = {"clients": k, "examples_per_client": n, "algorithm": name, "error": err}
        row["load_average_start"] = load
        row["subprocess_wall_seconds"] = wall
        rows.append(row)
        if ok:
          print(f"K={k} {name}: {row['client_steps_per_s']:,.0f} client-steps/s, "
                f"{row['rounds_per_s']:.2f} rounds/s, compile "
                f"{row['compile_seconds_first_minus_steady']:.2f} s, peak RSS "
                f"{row['peak_rss_gib']:.2f} GiB ({wall:.0f} s)", flush=True)
        else:
          print(f"K={k} {name}: FAILED {err[-500:]}", flush=True)
  out = {
      "benchmark": "client_scaling",
      "timestamp": C.timestamp(),
      "config": {"sizes": sizes, "examples_per_client": per, "rounds_per_call": rounds,
                 "clients_per_round": "all", "local_steps": FLAGS.local_steps,
                 "batch_size": FLAGS.batch_size, "repeats": FLAGS.repeats,
                 "algorithms": list(FLAGS.algorithms),
                 "hyperparameters": {n: C.HYPER[n] for n in FLAGS.algorithms},
                 "model": {"w": [784, C.NUM_CLASSES], "b": [C.NUM_CLASSES]},
                 "evaluate": False, "seed": FLAGS.seed,
                 "isolation": "one fresh subprocess per (size, algorithm)",
                 "statistic": "median over repeats within each subprocess"},
      "machine": machine,
      "load_average_end": C.load_average(),
      "results": rows,
      "ten_thousand_clients_ran": any(r.get("clients") == 10000 and "error" not in r
                                      and r.get("final_params_finite") for r in rows),
  }
  C.write_json(FLAGS.out, out)
  print()
  print(markdown_table(rows))
  print(f"\nwrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
