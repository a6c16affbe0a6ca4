r"""What a seed costs when an experiment runs its seeds as one program, per revision.

The driver runs a method's seeds as one vmapped ``fedco.sweep`` (``--seeds_together``, the
default). This benchmark times that against one seed alone, for this tree and another git
revision (``--base``, from a temporary ``git worktree``): each process runs
``python -m experiments.main --config=<config> <overrides> --config.seeds=<seeds>
--config.rounds=<R>`` whole, at ``R = --rounds`` and ``2R``; the difference of the two
wall times is the cost of ``R`` rounds with start-up, data loading and compilation taken
out. Processes alternate (revision by revision, one seed and two, short and long), so a
busy machine's drift hits all sides alike. Recorded per revision: seconds for ``R`` rounds
of one seed and of two seeds together, and ``per_seed_ratio`` = two seeds' / (2 x one
seed's): below 1 the program shares work, above 1 running seeds one by one is faster.

The default workload is E5 (ResNet20 on CIFAR-10 (JPEG), lossy: ``../shared/data``), MBSGD,
evaluating 2,000 rows of each split every 20 rounds: where two seeds as one program cost
6.7x a seed alone until a sweep's evaluation stopped running on every round (a
``lax.cond`` on a predicate batched over the runs is a select under ``vmap``; decision 116),
and 0.73x after (``benchmarks/results/seeds_together.json``).

Run::

    python -m benchmarks.seeds_together --base=HEAD~1 --out=benchmarks/results/seeds_together.json
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("base", "HEAD", "The git revision to compare against ('' for none).")
flags.DEFINE_string("config", "experiments/configs/imbalanced_cifar.py", "The config file.")
flags.DEFINE_list(
  "overrides",
  [
    "--config.data_dir=../shared/data/cifar10_jpeg/cifar10_jpeg.tar.gz",
    "--config.eval_every=20",
    "--config.eval_examples=2000",
    "--config.lr_drop_round=1000",
    "--methods=mbsgd",
  ],
  "Driver flags both revisions get (the default: E5, MBSGD).",
)
flags.DEFINE_integer("rounds", 40, "R: the processes run R and 2R rounds.")
flags.DEFINE_integer("seeds", 2, "n: seeds 0..n-1 as one program against seed 0 alone (n >= 2).")
flags.DEFINE_string("out", "benchmarks/results/seeds_together.json", "Where to write JSON.")


def _wall(tree: str, workdir: str, seeds: str, rounds: int) -> float:
  """Whole-process wall seconds of one run of the job in ``tree``."""
  from benchmarks import _common as C

  seeds = seeds if "," in seeds else seeds + ","
  flags_ = (*FLAGS.overrides, f"--config.seeds={seeds}", f"--config.rounds={rounds}")
  return C.driver_process(tree, FLAGS.config, workdir, *flags_)[0]


def main(argv):
  del argv
  from benchmarks import _common as C

  if FLAGS.seeds < 2 or FLAGS.rounds < 1:
    sys.exit(f"error: --seeds must be >= 2 and --rounds >= 1, got {FLAGS.seeds} and {FLAGS.rounds}")
  one, many = "0", ",".join(str(s) for s in range(FLAGS.seeds))
  # A path in the overrides is relative to this repository: the base tree is elsewhere.
  FLAGS.overrides = [o.replace("=../", f"={os.path.dirname(C.ROOT)}/", 1) for o in FLAGS.overrides]
  revisions = {"head": C.git_revision("HEAD")}
  if FLAGS.base:
    revisions["base"] = C.git_revision(FLAGS.base)
  load_before = C.load_average()
  walls = {side: {s: {} for s in (one, many)} for side in revisions}
  r = FLAGS.rounds
  with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
    trees = {"head": C.ROOT}
    if "base" in revisions:
      trees["base"] = stack.enter_context(C.worktree(revisions["base"], f"{tmp}/base"))
    n = 0
    for rounds in (r, 2 * r):
      for seeds in (one, many):
        for side, tree in trees.items():
          n += 1
          seconds = _wall(tree, os.path.join(tmp, f"run{n}"), seeds, rounds)
          walls[side][seeds][rounds] = seconds
          print(side, f"seeds {seeds}", f"{rounds} rounds", f"{seconds:.1f} s", flush=True)
  results = {}
  for side, by_seeds in walls.items():
    cost = {s: by_seeds[s][2 * r] - by_seeds[s][r] for s in (one, many)}
    results[side] = {
      "revision": revisions[side],
      "wall_seconds": {s: {str(k): v for k, v in w.items()} for s, w in by_seeds.items()},
      f"seconds_for_{r}_rounds": cost,
      "per_seed_ratio": cost[many] / (FLAGS.seeds * cost[one]),
    }
    print(side, f"per-seed ratio {results[side]['per_seed_ratio']:.2f}", flush=True)
  C.write_json(
    FLAGS.out,
    {
      "benchmark": "seeds_together",
      "timestamp": C.timestamp(),
      "machine": C.machine_info(),
      "load_average_before": load_before,
      "load_average_after": C.load_average(),
      "config": FLAGS.config,
      "overrides": FLAGS.overrides,
      "rounds": [r, 2 * r],
      "seeds": [one, many],
      "statistic": "whole-process wall seconds at 2R rounds minus at R rounds, one process each",
      "data_note": "CIFAR-10 (JPEG), lossy (default overrides)",
      "results": results,
    },
  )


if __name__ == "__main__":
  app.run(main)
