r"""This tree's single-run speed against another git revision's, side by side.

For a refactor that must not slow the simulator down: each side runs the logistic
benchmark's fedco workload (10 clients x 600 MNIST-shaped examples, logistic model, local
steps 5, batch 32, no evaluation; FedAvg, ComFedL and FedDRO) in its own subprocess, the
base revision from a temporary ``git worktree``. Subprocesses alternate (base, head, base,
...) ``--repeats`` times; each times ``--rounds`` rounds after a warm-up call and reports
its median over ``--inner`` calls. Recorded: per algorithm the median ms/round of each side
and ``head / base``.

Run::

    python -m benchmarks.revision --base=HEAD~1 --out=benchmarks/results/revision.json
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
flags.DEFINE_string("base", "HEAD", "The git revision to compare against.")
flags.DEFINE_string("out", "benchmarks/results/revision.json", "Where to write JSON.")
flags.DEFINE_list("algorithms", ["fedavg", "comfedl", "feddro"], "Registry algorithms.")
flags.DEFINE_integer("repeats", 5, "Subprocess pairs per algorithm.")
flags.DEFINE_integer("rounds", 50, "Rounds per timed call.")
flags.DEFINE_integer("inner", 7, "Timed calls per subprocess (the median is kept).")


# Runs with the compared tree as its working directory, so ``fedco`` and ``benchmarks._common``
# are that tree's (the base revision may predate this file).
_WORKER = """
import statistics, sys, time
import jax
from benchmarks import _common as C
name, rounds, inner = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
problem, algorithm = C.make_problem_and_algorithm(name, 5)
host, rows = C.make_data(10, 600, 0)
side = C.FedcoSide(problem, algorithm, host, rows, C.init_params(0), batch_size=32,
                   rounds=rounds, seed=0)
side.run()  # compile
times = []
for _ in range(inner):
  start = time.perf_counter()
  side.run()
  times.append(time.perf_counter() - start)
print(1e3 * statistics.median(times) / rounds)
"""


def _time(tree, name):
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  cmd = [sys.executable, "-c", _WORKER, name, str(FLAGS.rounds), str(FLAGS.inner)]
  proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"timing {name} in {tree} failed: {proc.stderr[-1500:]}")
  return float(proc.stdout.strip().splitlines()[-1])


def main(argv):
  del argv
  from benchmarks import _common as C

  base_rev, head_rev = C.git_revision(FLAGS.base), C.git_revision("HEAD")
  dirty = C.has_uncommitted_changes()
  load_before = C.load_average()
  results = {}
  with (
    tempfile.TemporaryDirectory() as tmp,
    C.worktree(base_rev, os.path.join(tmp, "base")) as base_tree,
  ):
    for name in FLAGS.algorithms:
      sides = {"base": [], "head": []}
      for _ in range(FLAGS.repeats):
        sides["base"].append(_time(base_tree, name))
        sides["head"].append(_time(C.ROOT, name))
      med = {k: statistics.median(v) for k, v in sides.items()}
      results[name] = {
        "ms_per_round": sides,
        "median_ms_per_round": med,
        "head_over_base": med["head"] / med["base"],
      }
      print(
        name,
        json.dumps(results[name]["median_ms_per_round"]),
        f"head/base {results[name]['head_over_base']:.3f}",
        flush=True,
      )
  C.write_json(
    FLAGS.out,
    {
      "benchmark": "revision",
      "timestamp": C.timestamp(),
      "machine": C.machine_info(),
      "load_average_before": load_before,
      "load_average_after": C.load_average(),
      "base": base_rev,
      "head": head_rev,
      "head_has_uncommitted_changes": dirty,
      "config": {
        "clients": 10,
        "examples_per_client": 600,
        "local_steps": 5,
        "batch_size": 32,
        "rounds_per_call": FLAGS.rounds,
        "calls": FLAGS.inner,
        "statistic": "median ms/round per subprocess, median over alternating subprocesses",
      },
      "results": results,
    },
  )


if __name__ == "__main__":
  app.run(main)
