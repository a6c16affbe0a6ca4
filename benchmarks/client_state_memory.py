r"""Peak memory of a SCAFFOLD run with many clients, this tree against a git revision.

Decision 109 keeps round-local state fields out of each client's stored state; SCAFFOLD
then stores one model-sized field per client instead of four. Each side runs, in its own
subprocess (the base revision from a temporary ``git worktree``), SCAFFOLD on ``--clients``
clients of a ``--params``-parameter quadratic (two examples each), ``--rounds`` rounds of
10 clients, a checkpoint every 2 rounds: what issue 45's Shakespeare run (715 roles, an
820,522-parameter LSTM) did when the kernel killed it. Recorded per side: the peak resident
set (``ru_maxrss``), the run's wall time and the bytes of the stored client state; and
``head / base`` of each. Sides alternate ``--repeats`` times (the medians are kept).

Run::

    python -m benchmarks.client_state_memory --base=7c47709 \
      --out=benchmarks/results/client_state_memory.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("base", "7c47709", "The git revision to compare against.")
flags.DEFINE_string("out", "benchmarks/results/client_state_memory.json", "Where to write JSON.")
flags.DEFINE_integer("clients", 715, "Clients (K).")
flags.DEFINE_integer("params", 200_000, "Model parameters.")
flags.DEFINE_integer("rounds", 4, "Rounds (10 clients each).")
flags.DEFINE_integer("repeats", 2, "Subprocess pairs.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs with the compared tree as its working directory, so ``fedco`` is that tree's.
_WORKER = """
import json, resource, sys, tempfile, time
import jax, jax.numpy as jnp, numpy as np, fedco
clients, params, rounds = map(int, sys.argv[1:4])
data = fedco.FederatedData.from_clients(
  [{"x": np.full((2, 1), k, np.float32)} for k in range(clients)])
problem = fedco.problems.plain(lambda w, e: 0.5 * jnp.sum((w - jnp.mean(e["x"])) ** 2))
start = time.perf_counter()
result = fedco.simulate(problem, fedco.scaffold(0.1, 2), data, jnp.zeros(params),
  rounds=rounds, clients_per_round=10, batch_size=None, evaluate=False,
  checkpoint_dir=tempfile.mkdtemp(), checkpoint_every=2)
seconds = time.perf_counter() - start
stored = sum(l.size * l.dtype.itemsize for l in jax.tree.leaves(result.state.clients))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak_rss_bytes": peak, "seconds": seconds, "stored_client_bytes": stored}))
"""


def _measure(tree):
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  args = [str(FLAGS.clients), str(FLAGS.params), str(FLAGS.rounds)]
  proc = subprocess.run(
    [sys.executable, "-c", _WORKER, *args], cwd=tree, env=env, capture_output=True, text=True
  )
  if proc.returncode != 0:
    raise RuntimeError(f"the run in {tree} failed: {proc.stderr[-1500:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv):
  del argv
  from benchmarks import _common as C

  base_rev, head_rev = C.git_revision(FLAGS.base), C.git_revision("HEAD")
  load_before = C.load_average()
  sides = {"base": [], "head": []}
  with tempfile.TemporaryDirectory() as tmp, C.worktree(base_rev, f"{tmp}/base") as base_tree:
    for _ in range(FLAGS.repeats):
      sides["base"].append(_measure(base_tree))
      sides["head"].append(_measure(ROOT))
      print(json.dumps({k: v[-1] for k, v in sides.items()}), flush=True)
  median = {
    side: {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    for side, runs in sides.items()
  }
  C.write_json(
    FLAGS.out,
    {
      "benchmark": "client_state_memory",
      "timestamp": C.timestamp(),
      "machine": C.machine_info(),
      "load_average_before": load_before,
      "load_average_after": C.load_average(),
      "base": base_rev,
      "head": head_rev,
      "config": {
        "algorithm": "scaffold(0.1, 2)",
        "clients": FLAGS.clients,
        "params": FLAGS.params,
        "rounds": FLAGS.rounds,
        "clients_per_round": 10,
        "checkpoint_every": 2,
      },
      "runs": sides,
      "median": median,
      "head_over_base": {k: median["head"][k] / median["base"][k] for k in median["head"]},
    },
  )


if __name__ == "__main__":
  app.run(main)
