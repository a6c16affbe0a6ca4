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
``init``, then one first ``run`` call (compilation + one chunk) with fedco alone in the
process, after which it reads the peak memory. Then the centralized baseline (the same
algorithm step on one model with the pooled batch ``K * b``, ``tau`` steps per
round-equivalent, one jitted ``lax.scan``; see ``benchmarks/_common.py``) is built and
warmed up, and ``--repeats`` timed calls of fedco and of the baseline alternate. It records:

* client-steps per second: ``K * tau * rounds / median seconds``, and rounds per second;
* ``fedco_time_over_central``: fedco's median seconds over the baseline's, the same
  examples processed (``K * tau * b`` per round);
* compile time: first call minus the steady median, and the sum of JAX's
  ``/jax/core/compile/*`` event durations (tracing, lowering, XLA compilation);
* peak memory: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` after each phase (data, init,
  fedco's first run, the timed runs with the baseline present); the reported peak is the
  one after fedco's first run. Also the bytes of live JAX arrays (``jax.live_arrays()``)
  after that run (``memory_stats()`` is ``None`` on CPU, so there is no device peak);
* whether the final server parameters are finite.

Run::

    python -m benchmarks.client_scaling --out=benchmarks/results/client_scaling.json
"""

from __future__ import annotations

import json
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results/client_scaling.json", "Where to write the JSON.")
flags.DEFINE_list("sizes", ["10", "100", "1000", "10000"], "Client counts K.")
flags.DEFINE_list(
  "examples_per_client", ["600", "200", "60", "20"], "Examples per client, one per size."
)
flags.DEFINE_list("rounds", ["50", "5", "1", "1"], "Rounds per timed run call, one per size.")
flags.DEFINE_list("algorithms", ["fedavg", "feddro"], "Algorithms (fedavg, feddro).")
flags.DEFINE_list(
  "repeats",
  ["5", "5", "3", "2"],
  "Timed run calls per size (one per size); the median is reported.",
)
flags.DEFINE_boolean(
  "central",
  True,
  "Also time one centralized jitted step with batch K * b (tau steps per "
  "round-equivalent), alternating with fedco's timed calls.",
)
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
flags.DEFINE_integer("worker_repeats", 3, "Internal (worker): timed run calls.")


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

  # Phase 1, fedco alone: the first call compiles; the peak RSS after it is fedco's peak
  # (later calls of the same program allocate the same buffers).
  compile_before = dict(events)
  t0 = time.perf_counter()
  run()
  first = time.perf_counter() - t0
  compile_events = {e: v - compile_before.get(e, 0.0) for e, v in events.items()}
  rss["after_first_run"] = C.maxrss_bytes()
  live = C.live_array_bytes()
  # Phase 2: the centralized step (batch K * b, tau steps per round-equivalent) joins, and
  # the two sides' timed calls alternate.
  central = None
  if FLAGS.central:
    central = C.CentralSide(
      name,
      problem,
      algorithm,
      data.examples,
      C.init_params(FLAGS.seed),
      batch=k * FLAGS.batch_size,
      local_steps=tau,
      rounds=rounds,
      seed=FLAGS.seed,
    )
  sides = {"fedco": run, **({"central": central.run} if central else {})}
  timed = C.alternate(sides, FLAGS.worker_repeats, warm=("fedco",)) if central else None
  if timed is None:
    times = []
    for _ in range(FLAGS.worker_repeats):
      t0 = time.perf_counter()
      run()
      times.append(time.perf_counter() - t0)
  else:
    times = timed["fedco"]["seconds"]
  rss["after_timed_runs_with_central"] = C.maxrss_bytes()
  med = statistics.median(times)
  params = state.server["params"]
  result = {
    "clients": k,
    "examples_per_client": n,
    "total_examples": k * n,
    "algorithm": name,
    "rounds_per_call": rounds,
    "repeats": FLAGS.worker_repeats,
    "seconds": times,
    "median_seconds": med,
    "rounds_per_s": rounds / med,
    "ms_per_round": 1e3 * med / rounds,
    "client_steps_per_s": k * tau * rounds / med,
    "us_per_client_step": 1e6 * med / (k * tau * rounds),
    "first_call_seconds": first,
    "compile_seconds_first_minus_steady": first - med,
    "compile_seconds_jax_events": sum(compile_events.values()),
    "compile_event_seconds": compile_events,
    "init_seconds": init_seconds,
    "data_build_seconds": data_seconds,
    "maxrss_bytes": rss,
    "peak_rss_gib": rss["after_first_run"] / 2**30,
    "live_array_bytes_after_first_run": live,
    "federated_data_bytes": data_bytes,
    "sim_state_bytes": state_bytes,
    "rounds_run": int(state.round),
    "final_params_finite": C.finite(params),
    "final_mean_loss_first_10000": float(
      C.mean_loss(params, jax.tree.map(jnp.asarray, eval_examples))
    ),
    "load_average_end": C.load_average(),
  }
  if central is not None:
    c = timed["central"]
    result["central"] = {
      "batch_size": k * FLAGS.batch_size,
      "seconds": c["seconds"],
      "median_seconds": c["median_seconds"],
      "first_call_seconds": c["first_call_seconds"],
      "ms_per_round_equivalent": 1e3 * c["median_seconds"] / rounds,
      "examples_per_s": k * tau * FLAGS.batch_size * rounds / c["median_seconds"],
      "final_params_finite": C.finite(central.params()),
    }
    result["fedco_time_over_central"] = med / c["median_seconds"]
  with open(FLAGS.result_file, "w") as f:
    json.dump(result, f)


def markdown_table(rows) -> str:
  lines = [
    "| K | examples/client | algorithm | rounds/s | client-steps/s | us/client-step "
    "| fedco time / central | compile s | peak RSS GiB | live arrays MiB | finite |",
    "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|:---:|",
  ]
  for r in rows:
    if "error" in r:
      lines.append(
        f"| {r['clients']} | {r['examples_per_client']} | {r['algorithm']} "
        f"| failed: {r['error'][:60]} | | | | | | | |"
      )
      continue
    live = r["live_array_bytes_after_first_run"]
    ratio = r.get("fedco_time_over_central")
    lines.append(
      f"| {r['clients']} | {r['examples_per_client']} | {r['algorithm']} "
      f"| {r['rounds_per_s']:.2f} | {r['client_steps_per_s']:,.0f} "
      f"| {r['us_per_client_step']:.1f} | {'-' if ratio is None else f'{ratio:.2f}x'} "
      f"| {r['compile_seconds_jax_events']:.2f} "
      f"| {r['peak_rss_gib']:.2f} | {'-' if live is None else f'{live / 2**20:.0f}'} "
      f"| {'yes' if r['final_params_finite'] else 'NO'} |"
    )
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
  repeats = [int(s) for s in FLAGS.repeats]
  if not len(sizes) == len(per) == len(rounds) == len(repeats):
    raise app.UsageError(
      "--sizes, --examples_per_client, --rounds and --repeats need one entry each"
    )
  for name in FLAGS.algorithms:
    if name not in ("fedavg", "feddro"):
      raise app.UsageError(f"unknown algorithm {name!r}; choose fedavg or feddro")
  machine = C.machine_info()
  print(
    f"machine: {machine['platform']} | {machine['cpu_model']} x{machine['cpu_count']} | "
    f"{machine['mem_total_gib']} GiB | jax {machine['jax']} | load "
    f"{machine['load_average_start']}",
    flush=True,
  )
  rows = []
  for k, n, r, rep in zip(sizes, per, rounds, repeats):
    for name in FLAGS.algorithms:
      args = [f"--clients={k}", f"--per_client={n}", f"--algorithm={name}"]
      args += [f"--worker_rounds={r}", f"--worker_repeats={rep}", f"--central={FLAGS.central}"]
      args += [f"--local_steps={FLAGS.local_steps}", f"--batch_size={FLAGS.batch_size}"]
      args += [f"--seed={FLAGS.seed}"]
      load = C.load_average()
      row, err, wall = C.run_worker("benchmarks.client_scaling", args, FLAGS.timeout)
      ok = row is not None
      if not ok:
        row = {"clients": k, "examples_per_client": n, "algorithm": name, "error": err}
      row["load_average_start"] = load
      row["subprocess_wall_seconds"] = wall
      rows.append(row)
      if ok:
        print(
          f"K={k} {name}: {row['client_steps_per_s']:,.0f} client-steps/s, "
          f"{row['rounds_per_s']:.2f} rounds/s, fedco/central time "
          f"{row.get('fedco_time_over_central', float('nan')):.2f}x, compile "
          f"{row['compile_seconds_jax_events']:.2f} s, peak RSS "
          f"{row['peak_rss_gib']:.2f} GiB ({wall:.0f} s)",
          flush=True,
        )
      else:
        print(f"K={k} {name}: FAILED {err[-500:]}", flush=True)
  out = {
    "benchmark": "client_scaling",
    "timestamp": C.timestamp(),
    "config": {
      "sizes": sizes,
      "examples_per_client": per,
      "rounds_per_call": rounds,
      "clients_per_round": "all",
      "local_steps": FLAGS.local_steps,
      "batch_size": FLAGS.batch_size,
      "repeats": repeats,
      "algorithms": list(FLAGS.algorithms),
      "hyperparameters": {n: C.HYPER[n] for n in FLAGS.algorithms},
      "model": {"w": [C.NUM_CLASSES, 784], "b": [C.NUM_CLASSES]},
      "evaluate": False,
      "seed": FLAGS.seed,
      "isolation": "one fresh subprocess per (size, algorithm)",
      "statistic": "median over repeats within each subprocess; fedco's and the "
      "centralized step's timed calls alternate",
      "compile_time": "sum of JAX's /jax/core/compile/* event durations during "
      "the first run call (tracing, lowering, XLA compilation); "
      "first call minus steady median is also recorded",
      "peak_memory": "ru_maxrss after fedco's first run call, before the "
      "centralized baseline is built",
    },
    "machine": machine,
    "load_average_end": C.load_average(),
    "results": rows,
    "ten_thousand_clients_ran": any(
      r.get("clients") == 10000 and "error" not in r and r.get("final_params_finite") for r in rows
    ),
  }
  C.write_json(FLAGS.out, out)
  print()
  print(markdown_table(rows))
  print(f"\nwrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
