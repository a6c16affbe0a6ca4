r"""Skewed clients: one client of 50,000 examples and 5,000 clients of one example.

The layout that stores each client as a row of a ``[K, max_n]`` index table costs clients x
largest client: here 5,001 x 50,000 int32 = 1.0 GB. fedco stores each client as a slice
``(offset, count)`` of one sorted row list, ``O(total examples)``. Each side runs in a fresh
subprocess (``--worker``), so its peak resident memory is its own:

* ``fedco``: ``FederatedData.from_index_lists`` (the build), then ``Simulator`` + ``init``
  (compilation included) and ``--rounds`` rounds of FedAvg on a logistic model, 100 clients
  per round, batch 32, with exact evaluation over all 55,000 examples every round.
* ``index_table``: the same data built the previous way (one padded index row per client,
  stacked and put on the device), the build only; ``--table=false`` skips it.

Recorded per side: seconds to build, peak RSS of the process, and RSS after the imports
(what the build adds is the difference); for fedco also the first chunk's seconds and the
final objective. Targets: fedco builds in under 2 s and under 500 MB peak.

Run::

    python -m benchmarks.skewed_clients --out=benchmarks/results/skewed_clients.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from benchmarks import _common as C

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results/skewed_clients.json", "Where to write JSON.")
flags.DEFINE_string(
  "worker", None, "Internal: run one side (fedco or index_table) and print its JSON."
)
flags.DEFINE_integer("big", 50_000, "Examples of the one large client.")
flags.DEFINE_integer("small_clients", 5_000, "Clients of one example each.")
flags.DEFINE_integer("features", 16, "Features per example.")
flags.DEFINE_integer("rounds", 3, "Rounds fedco runs after building.")
flags.DEFINE_boolean("table", True, "Also measure the [K, max_n] index-table build.")
flags.DEFINE_integer("timeout", 900, "Seconds per worker subprocess.")


def _data():
  rng = np.random.default_rng(0)
  n = FLAGS.big + FLAGS.small_clients
  examples = {
    "x": rng.normal(size=(n, FLAGS.features)).astype(np.float32),
    "y": rng.integers(0, 2, size=n).astype(np.int32),
  }
  rows = [np.arange(FLAGS.big)] + [np.array([FLAGS.big + k]) for k in range(FLAGS.small_clients)]
  return examples, rows


def _fedco_worker():
  import jax
  import jax.numpy as jnp

  import fedco

  examples, rows = _data()
  after_imports = C.maxrss_bytes()
  start = time.perf_counter()
  data = fedco.FederatedData.from_index_lists(examples, rows)
  jax.block_until_ready(data)
  build = time.perf_counter() - start

  def loss(params, example):
    logit = example["x"] @ params["w"] + params["b"]
    return jnp.logaddexp(0.0, logit) - example["y"] * logit

  params = {"w": jnp.zeros((FLAGS.features,)), "b": jnp.zeros(())}
  start = time.perf_counter()
  sim = fedco.Simulator(
    fedco.problems.plain(loss), fedco.fedavg(0.1, 2), data, clients_per_round=100, batch_size=32
  )
  state = jax.block_until_ready(sim.init(params, 0))
  init = time.perf_counter() - start
  start = time.perf_counter()
  state, metrics = jax.block_until_ready(sim.run(state, FLAGS.rounds))
  first_chunk = time.perf_counter() - start
  return {
    "build_s": build,
    "init_s_incl_compile": init,
    "first_chunk_s_incl_compile": first_chunk,
    "rounds": FLAGS.rounds,
    "final_objective": float(metrics["objective"][-1]),
    "rss_after_imports_bytes": after_imports,
    "peak_rss_bytes": C.maxrss_bytes(),
    "structure_bytes": int(
      sum(a.nbytes for a in (data.counts, data.offsets, data.flat_rows, data.flat_owner))
    ),
  }


def _table_worker():
  import jax
  import jax.numpy as jnp

  examples, rows = _data()
  after_imports = C.maxrss_bytes()
  start = time.perf_counter()
  counts = np.array([r.size for r in rows], np.int32)
  table = np.stack(
    [np.concatenate([r, np.full(counts.max() - r.size, r[0])]) for r in rows]
  ).astype(np.int32)
  table = jax.block_until_ready(jnp.asarray(table))
  build = time.perf_counter() - start
  return {
    "build_s": build,
    "rss_after_imports_bytes": after_imports,
    "peak_rss_bytes": C.maxrss_bytes(),
    "structure_bytes": int(table.nbytes),
  }


def _side(name):
  cmd = [
    sys.executable,
    "-m",
    "benchmarks.skewed_clients",
    f"--worker={name}",
    f"--big={FLAGS.big}",
    f"--small_clients={FLAGS.small_clients}",
    f"--features={FLAGS.features}",
    f"--rounds={FLAGS.rounds}",
  ]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=FLAGS.timeout, check=False)
  if proc.returncode != 0:
    return {"error": proc.stderr[-2000:]}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv):
  del argv
  if FLAGS.worker:
    side = {"fedco": _fedco_worker, "index_table": _table_worker}[FLAGS.worker]
    print(json.dumps(side()))
    return
  load_before = C.load_average()
  sides = {"fedco": _side("fedco")}
  if FLAGS.table:
    sides["index_table"] = _side("index_table")
  mib = lambda b: round(b / 2**20, 1)
  for rec in sides.values():
    if "peak_rss_bytes" in rec:
      rec["peak_rss_mib"] = mib(rec["peak_rss_bytes"])
      rec["build_added_rss_mib"] = mib(rec["peak_rss_bytes"] - rec["rss_after_imports_bytes"])
  fedco_side = sides["fedco"]
  out = {
    "benchmark": "skewed_clients",
    "timestamp": C.timestamp(),
    "machine": C.machine_info(),
    "load_average_before": load_before,
    "load_average_after": C.load_average(),
    "clients": 1 + FLAGS.small_clients,
    "examples": FLAGS.big + FLAGS.small_clients,
    "features": FLAGS.features,
    "sides": sides,
    "targets": {
      "build_under_2_s": fedco_side.get("build_s", 1e9) < 2.0,
      "peak_under_500_mib": fedco_side.get("peak_rss_bytes", 1e18) < 500 * 2**20,
    },
  }
  table = sides.get("index_table", {})
  if "build_s" in table and "build_s" in fedco_side:
    out["ratios"] = {
      "build_time_table_over_fedco": table["build_s"] / fedco_side["build_s"],
      "structure_bytes_table_over_fedco": table["structure_bytes"] / fedco_side["structure_bytes"],
      "peak_rss_table_over_fedco": table["peak_rss_bytes"] / fedco_side["peak_rss_bytes"],
    }
  C.write_json(FLAGS.out, out)
  print(json.dumps({k: out[k] for k in ("sides", "targets", "ratios") if k in out}, indent=1))


if __name__ == "__main__":
  app.run(main)
