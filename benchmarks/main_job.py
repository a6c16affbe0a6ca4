r"""The main job's wall time and compiled programs: this tree against another git revision.

Each side runs ``python -m experiments.main --config=<config> --workdir=<fresh>`` as a
whole process (imports, data, every compile and run, the figure and summary), the base
revision from a temporary ``git worktree``; the sides alternate (base, head, base, ...)
``--repeats`` times. With ``JAX_LOG_COMPILES=1`` every XLA compilation is logged, so each
side's compiled programs are counted by name, with their compile seconds (a program loaded
from the persistent compilation cache counts as a hit, not a compile). The head runs with a
fresh, empty ``--compilation_cache`` (its seeds share their methods' programs), then
``head_warm`` reruns it with other seeds (``--warm_seeds``) on the cache the head run left:
the driver's second run with new seeds, same shapes. The tables of base and head are
compared.

Run::

    python -m benchmarks.main_job --base=f23d356 --out=benchmarks/results/main_job.json
"""

from __future__ import annotations

import collections
import json
import os
import re
import statistics
import tempfile

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("base", "HEAD", "The git revision to compare against.")
flags.DEFINE_string("config", "experiments/configs/dro_fl.py", "The job's config file.")
flags.DEFINE_list("overrides", [], "Extra driver flags, e.g. --config.rounds=50 (both sides).")
flags.DEFINE_integer("repeats", 3, "Alternating process pairs.")
flags.DEFINE_string("warm_seeds", "10,11,12", "head_warm's seeds (--config.seeds=).")
flags.DEFINE_bool(
  "base_cache",
  False,
  "Give the base side a fresh --compilation_cache too "
  "(a base that has the flag); otherwise it runs with its defaults.",
)
flags.DEFINE_string("out", "benchmarks/results/main_job.json", "Where to write JSON.")

COMPILED = re.compile(r"Finished XLA compilation of (\S+) in ([0-9.]+) sec")
HIT = re.compile(r"Persistent compilation cache hit for '(\S+)'")


def _run(tree: str, workdir: str, *flags_):
  """One whole process of the job in ``tree``: wall seconds, compiles, table lines."""
  from benchmarks import _common as C

  seconds, proc = C.driver_process(
    tree, FLAGS.config, workdir, *FLAGS.overrides, *flags_, env={"JAX_LOG_COMPILES": "1"}
  )
  hits = HIT.findall(proc.stderr)
  compiles = [(name, float(s)) for name, s in COMPILED.findall(proc.stderr)]
  by_name = collections.Counter(name for name, _ in compiles)
  for name in hits:  # logged as a (fast) compilation too
    by_name[name.replace("jit_", "jit(", 1) + ")"] -= 1
  # --noprogress prints no table: the summary's is compared instead
  with open(os.path.join(workdir, "summary.json")) as f:
    table = json.load(f)["table"]
  return {
    "seconds": seconds,
    "compiles": len(compiles) - len(hits),
    "cache_hits": len(hits),
    "compile_seconds": sum(s for _, s in compiles),
    "by_name": dict(by_name),
    "table": table,
  }


def main(argv):
  del argv
  from benchmarks import _common as C

  base_rev, head_rev = C.git_revision(FLAGS.base), C.git_revision("HEAD")
  dirty = C.has_uncommitted_changes()
  load_before = C.load_average()
  runs = {"base": [], "head": [], "head_warm": []}
  with (
    tempfile.TemporaryDirectory() as tmp,
    C.worktree(base_rev, os.path.join(tmp, "base")) as base_tree,
  ):
    for i in range(FLAGS.repeats):
      cache = f"--compilation_cache={os.path.join(tmp, f'cache{i}')}"
      base_flags = (
        (f"--compilation_cache={os.path.join(tmp, f'base_cache{i}')}",) if FLAGS.base_cache else ()
      )
      for side, tree, extra in (
        ("base", base_tree, base_flags),
        ("head", C.ROOT, (cache,)),
        ("head_warm", C.ROOT, (cache, f"--config.seeds={FLAGS.warm_seeds}")),
      ):
        out = _run(tree, os.path.join(tmp, f"{side}{i}"), *extra)
        runs[side].append(out)
        print(
          side,
          f"{out['seconds']:.1f} s, {out['compiles']} compiles "
          f"({out['compile_seconds']:.1f} s), {out['cache_hits']} cache hits",
          flush=True,
        )
  median = {side: statistics.median(r["seconds"] for r in rs) for side, rs in runs.items()}
  summary = {
    side: {
      "median_seconds": median[side],
      "seconds": [r["seconds"] for r in rs],
      "compiles": rs[0]["compiles"],
      "cache_hits": rs[0]["cache_hits"],
      "compiles_by_name": {k: v for k, v in rs[0]["by_name"].items() if v},
      "median_compile_seconds": statistics.median(r["compile_seconds"] for r in rs),
    }
    for side, rs in runs.items()
  }
  tables_equal = all(
    r["table"] == runs["base"][0]["table"] for side in ("base", "head") for r in runs[side]
  )
  print(
    f"head / base wall time {median['head'] / median['base']:.3f}, head_warm / base "
    f"{median['head_warm'] / median['base']:.3f}; tables equal: {tables_equal}"
  )
  C.write_json(
    FLAGS.out,
    {
      "benchmark": "main_job",
      "timestamp": C.timestamp(),
      "machine": C.machine_info(),
      "load_average_before": load_before,
      "load_average_after": C.load_average(),
      "base": base_rev,
      "base_fresh_cache": FLAGS.base_cache,
      "head": head_rev,
      "head_has_uncommitted_changes": dirty,
      "command": f"python -m experiments.main --config={FLAGS.config} --workdir=<fresh> "
      f"--noprogress {' '.join(FLAGS.overrides)}".strip(),
      "statistic": "whole-process wall seconds, median over alternating processes; "
      "compiles: XLA compilations logged by JAX_LOG_COMPILES",
      "sides": summary,
      "head_over_base": median["head"] / median["base"],
      "head_warm_over_base": median["head_warm"] / median["base"],
      "tables_equal": tables_equal,
      "table": runs["head"][0]["table"],
    },
  )


if __name__ == "__main__":
  app.run(main)
