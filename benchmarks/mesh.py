r"""1 device against 8 (forced host) CPU devices: same results, and what it costs.

The logistic workload (multinomial logistic regression 784 -> 10, synthetic MNIST-shaped
data, 5 local steps, batch 32) with 64 clients of 200 examples. Cases: ``fedavg`` and
``feddro`` with all 64 clients per round, and ``feddro`` with 60 sampled clients per round
(60 is not a multiple of 8, so the 8-device run pads the round with 4 masked client slots).

Two fresh subprocesses:

* ``1dev``: the default single CPU device; runs ``mesh=None`` and
  ``mesh=fedco.runtime.client_mesh(1)``;
* ``8dev``: ``XLA_FLAGS=--xla_force_host_platform_device_count=8``; runs
  ``mesh=client_mesh(1)`` and ``mesh=client_mesh(8)`` (each round's clients laid along the
  ``"clients"`` axis, 8 per device).

Within a subprocess the configurations' timed repeats alternate. Every configuration runs the
same rounds from the same seed (``--warmup_calls`` untimed ``run`` calls, then ``--repeats``
timed calls of ``--rounds`` rounds), and the parent compares the final server parameters (and
FedDRO's ``y_bar``) of every configuration with the single-device ``mesh=None`` run.

The 8 forced devices share the machine's 2 physical cores, so no speedup is expected; the
point is that sharding changes neither the result (up to float32 summation order) nor the
program's cost much, and what it does to compile time. No GPU was lent to this session (the
session's ``device`` tool reported none for this task), so nothing ran on an accelerator.

Run::

    python -m benchmarks.mesh --out=benchmarks/results/mesh.json
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
flags.DEFINE_string("out", "benchmarks/results/mesh.json", "Where to write the JSON.")
flags.DEFINE_integer("clients", 64, "Clients K.")
flags.DEFINE_integer("examples_per_client", 200, "Synthetic examples per client.")
flags.DEFINE_list(
  "cases", ["fedavg:64", "feddro:64", "feddro:60"], "algorithm:clients_per_round pairs."
)
flags.DEFINE_integer("rounds", 10, "Rounds per run call.")
flags.DEFINE_integer("repeats", 4, "Timed run calls per configuration (median reported).")
flags.DEFINE_integer("local_steps", 5, "Local steps per round.")
flags.DEFINE_integer("batch_size", 32, "Examples per client per step.")
flags.DEFINE_integer("seed", 0, "Seed.")
flags.DEFINE_float(
  "atol",
  1e-5,
  "Largest allowed absolute difference of the final parameters (float32 "
  "summation-order tolerance; the parameters are O(0.1)).",
)
flags.DEFINE_float(
  "rtol_shared", 1e-5, "Largest allowed difference of FedDRO's y_bar relative to its size."
)
flags.DEFINE_integer("timeout", 600, "Seconds per worker subprocess.")
flags.DEFINE_integer("devices", 8, "Forced host devices in the multi-device run.")
flags.DEFINE_integer("warmup_calls", 2, "Untimed warm-up calls per configuration.")
# worker mode
flags.DEFINE_string("worker", "", "Internal: '1dev' or '8dev'.")
flags.DEFINE_string("result_dir", "", "Internal: where the worker writes its files.")


def worker():
  import statistics

  import jax
  import numpy as np

  import fedco
  from benchmarks import _common as C

  events = {}
  counter = {"backend_compiles": 0}

  def on_event(event, duration, **kwargs):
    del kwargs
    if event.startswith("/jax/core/compile/"):
      events[event] = events.get(event, 0.0) + float(duration)
    if event == "/jax/core/compile/backend_compile_duration":
      counter["backend_compiles"] += 1

  jax.monitoring.register_event_duration_secs_listener(on_event)
  multi = FLAGS.worker == "8dev"
  if multi and jax.device_count() != FLAGS.devices:
    raise RuntimeError(
      f"expected {FLAGS.devices} forced host devices, got "
      f"{jax.device_count()} (XLA_FLAGS={os.environ.get('XLA_FLAGS')!r})"
    )
  configs = (
    {"mesh1": 1, f"mesh{FLAGS.devices}": FLAGS.devices} if multi else {"none": None, "mesh1": 1}
  )
  host, rows = C.make_data(FLAGS.clients, FLAGS.examples_per_client, FLAGS.seed)
  data = fedco.FederatedData.from_index_lists(host, rows)
  params0 = C.init_params(FLAGS.seed)
  out = {"machine": C.machine_info(), "cases": {}}
  arrays = {}
  for case in FLAGS.cases:
    name, m = case.split(":")
    problem, algorithm = C.make_problem_and_algorithm(name, FLAGS.local_steps)
    sims, states, runs = {}, {}, {}
    for label, d in configs.items():
      mesh = None if d is None else fedco.runtime.client_mesh(d)
      sims[label] = fedco.Simulator(
        problem,
        algorithm,
        data,
        batch_size=FLAGS.batch_size,
        clients_per_round=int(m),
        evaluate=False,
        mesh=mesh,
      )
      states[label] = sims[label].init(params0, FLAGS.seed)

      def run(label=label, states=states, sims=sims):
        states[label], metrics = sims[label].run(states[label], FLAGS.rounds)
        jax.block_until_ready((states[label], metrics))

      runs[label] = run
    # Warm-up: --warmup_calls untimed calls per configuration (the same number for all, so
    # all run the same rounds). With a mesh, ``init`` returns single-device arrays and ``run``
    # returns NamedSharding arrays, so the second call compiles the program again; the JSON
    # records which warm-up calls compiled.
    compile_events, first, warm_calls = {}, {}, {}
    for label, run in runs.items():
      before = dict(events)
      calls = []
      for _ in range(FLAGS.warmup_calls):
        c0 = counter["backend_compiles"]
        t0 = time.perf_counter()
        run()
        calls.append(
          {
            "seconds": time.perf_counter() - t0,
            "backend_compiles": counter["backend_compiles"] - c0,
          }
        )
      first[label] = calls[0]["seconds"]
      warm_calls[label] = calls
      compile_events[label] = {e: v - before.get(e, 0.0) for e, v in events.items()}
    times = {label: [] for label in runs}
    compiles_timed = {label: 0 for label in runs}
    for _ in range(FLAGS.repeats):
      for label, run in runs.items():
        c0 = counter["backend_compiles"]
        t0 = time.perf_counter()
        run()
        times[label].append(time.perf_counter() - t0)
        compiles_timed[label] += counter["backend_compiles"] - c0
    rec = {}
    for label in runs:
      med = statistics.median(times[label])
      st = states[label]
      rec[label] = {
        "devices_in_mesh": configs[label],
        "seconds": times[label],
        "median_seconds": med,
        "rounds_per_s": FLAGS.rounds / med,
        "first_call_seconds": first[label],
        "compile_seconds_first_minus_steady": first[label] - med,
        "warmup_calls": warm_calls[label],
        "warmup_calls_that_compiled": sum(c["backend_compiles"] > 0 for c in warm_calls[label]),
        "compile_seconds_jax_events": sum(compile_events[label].values()),
        "compile_event_seconds": compile_events[label],
        "compiles_while_timed": compiles_timed[label],
        "rounds_run": int(st.round),
        "final_params_finite": C.finite(st.server["params"]),
        "server_params_sharding": str(jax.tree.leaves(st.server["params"])[0].sharding),
        "client_state_sharding": str(jax.tree.leaves(st.clients)[0].sharding),
      }
      for leaf, value in st.server["params"].items():
        arrays[f"{case}|{label}|params.{leaf}"] = np.asarray(value)
      for field, value in st.shared.items():
        arrays[f"{case}|{label}|shared.{field}"] = np.asarray(value)
    out["cases"][case] = rec
  np.savez(os.path.join(FLAGS.result_dir, "arrays.npz"), **arrays)
  with open(os.path.join(FLAGS.result_dir, "result.json"), "w") as f:
    json.dump(out, f)


def _run_worker(kind, extra_env, tmp):
  env = dict(os.environ)
  env.update(extra_env)
  cmd = [
    sys.executable,
    "-m",
    "benchmarks.mesh",
    f"--worker={kind}",
    f"--result_dir={tmp}",
    f"--clients={FLAGS.clients}",
    f"--examples_per_client={FLAGS.examples_per_client}",
    f"--cases={','.join(FLAGS.cases)}",
    f"--rounds={FLAGS.rounds}",
    f"--repeats={FLAGS.repeats}",
    f"--local_steps={FLAGS.local_steps}",
    f"--batch_size={FLAGS.batch_size}",
    f"--seed={FLAGS.seed}",
    f"--devices={FLAGS.devices}",
    f"--warmup_calls={FLAGS.warmup_calls}",
  ]
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=FLAGS.timeout)
  if proc.returncode != 0:
    raise RuntimeError(f"worker {kind} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
  with open(os.path.join(tmp, "result.json")) as f:
    result = json.load(f)
  result["subprocess_wall_seconds"] = time.perf_counter() - t0
  import numpy as np

  with np.load(os.path.join(tmp, "arrays.npz")) as z:
    arrays = {k: z[k] for k in z.files}
  return result, arrays


def main(argv):
  del argv
  if FLAGS.worker:
    worker()
    return
  import numpy as np

  from benchmarks import _common as C

  load_start = C.load_average()
  multi = f"mesh{FLAGS.devices}"
  flag = f"--xla_force_host_platform_device_count={FLAGS.devices}"
  xla_flags = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
  with tempfile.TemporaryDirectory() as t1, tempfile.TemporaryDirectory() as t8:
    one, arr1 = _run_worker("1dev", {}, t1)
    eight, arr8 = _run_worker("8dev", {"XLA_FLAGS": xla_flags}, t8)
  results = {}
  for case in FLAGS.cases:
    ref_keys = [k for k in arr1 if k.startswith(f"{case}|none|")]
    runs = {
      "1dev/none": one["cases"][case]["none"],
      "1dev/mesh1": one["cases"][case]["mesh1"],
      "8dev/mesh1": eight["cases"][case]["mesh1"],
      f"8dev/{multi}": eight["cases"][case][multi],
    }
    arrays = {"1dev/mesh1": arr1, "8dev/mesh1": arr8, f"8dev/{multi}": arr8}
    rec = {"runs": runs, "max_abs_diff_vs_1dev_none": {}, "max_abs_diff_shared_vs_1dev_none": {}}
    for label, arr in arrays.items():
      config = label.split("/")[1]
      pdiff, sdiff = 0.0, 0.0
      for key in ref_keys:
        other = arr[key.replace("|none|", f"|{config}|")]
        d = float(np.max(np.abs(arr1[key].astype(np.float64) - other.astype(np.float64))))
        if "|params." in key:
          pdiff = max(pdiff, d)
        else:
          sdiff = max(sdiff, d)
      rec["max_abs_diff_vs_1dev_none"][label] = pdiff
      if any("|shared." in k for k in ref_keys):
        rec["max_abs_diff_shared_vs_1dev_none"][label] = sdiff
    rec["max_abs_params"] = max(float(np.max(np.abs(arr1[k]))) for k in ref_keys if "|params." in k)
    shared = [k for k in ref_keys if "|shared." in k]
    if shared:  # FedDRO's y_bar (about 8.6 here): judged relative to its size
      rec["max_abs_shared"] = max(float(np.max(np.abs(arr1[k]))) for k in shared)
      rec["shared_within_rtol"] = all(
        v <= FLAGS.rtol_shared * rec["max_abs_shared"]
        for v in rec["max_abs_diff_shared_vs_1dev_none"].values()
      )
    rec["max_abs_diff_8dev_vs_1dev"] = rec["max_abs_diff_vs_1dev_none"][f"8dev/{multi}"]
    rec["within_tolerance"] = all(
      v <= FLAGS.atol for v in rec["max_abs_diff_vs_1dev_none"].values()
    ) and rec.get("shared_within_rtol", True)
    rec["rounds_per_s_8dev_over_1dev"] = (
      runs[f"8dev/{multi}"]["rounds_per_s"] / runs["1dev/none"]["rounds_per_s"]
    )
    results[case] = rec
  out = {
    "benchmark": "mesh",
    "timestamp": C.timestamp(),
    "config": {
      "clients": FLAGS.clients,
      "examples_per_client": FLAGS.examples_per_client,
      "model": {"w": [C.NUM_CLASSES, 784], "b": [C.NUM_CLASSES]},
      "cases": list(FLAGS.cases),
      "rounds_per_call": FLAGS.rounds,
      "repeats": FLAGS.repeats,
      "local_steps": FLAGS.local_steps,
      "batch_size": FLAGS.batch_size,
      "seed": FLAGS.seed,
      "atol": FLAGS.atol,
      "rtol_shared": FLAGS.rtol_shared,
      "forced_devices": FLAGS.devices,
      "xla_flags_8dev": xla_flags,
      "warmup_calls": FLAGS.warmup_calls,
      "rounds_run_per_config": FLAGS.rounds * (FLAGS.repeats + FLAGS.warmup_calls),
      "evaluate": False,
      "statistic": "median over repeats; configurations alternate within a subprocess",
      "note": "forced host devices share the machine's physical cores; no speedup is expected.",
    },
    "machine_1dev": one["machine"],
    "machine_8dev": eight["machine"],
    "load_average_start": load_start,
    "load_average_end": C.load_average(),
    "subprocess_wall_seconds": {
      "1dev": one["subprocess_wall_seconds"],
      "8dev": eight["subprocess_wall_seconds"],
    },
    "gpu_lent": bool(one["machine"].get("gpu_lent", False)),  # the children's backend
    "results": results,
    "all_within_tolerance": all(r["within_tolerance"] for r in results.values()),
  }
  C.write_json(FLAGS.out, out)
  lines = [
    "| case | config | rounds/s | compile s (JAX events) | warm-up calls that compiled "
    "| max abs diff vs 1 device |",
    "|---|---|---:|---:|---:|---:|",
  ]
  for case, rec in results.items():
    for label, run in rec["runs"].items():
      diff = rec["max_abs_diff_vs_1dev_none"].get(label)
      lines.append(
        f"| {case} | {label} | {run['rounds_per_s']:.1f} "
        f"| {run['compile_seconds_jax_events']:.2f} "
        f"| {run['warmup_calls_that_compiled']} of {len(run['warmup_calls'])} "
        f"| {'(reference)' if diff is None else f'{diff:.2e}'} |"
      )
  print("\n".join(lines))
  print(f"\nall within atol {FLAGS.atol:g}: {out['all_within_tolerance']}")
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
