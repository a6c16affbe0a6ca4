r"""The papers' image experiments on real images, at the papers' lengths, for an accelerator.

    python -m benchmarks.paper_images --out=benchmarks/results/paper_images.json
    python -m benchmarks.paper_images --out=... --runs=e4_5w1s --scale=0.1

Issue 47: E4 on Omniglot (the upstream zips), E5 on CIFAR10-ST and E2 on dominant-class
CIFAR-10, both from CIFAR-10 **(JPEG)** (``cifar10_jpeg.tar.gz``: lossy, every number on it
is a comparison of methods with each other). A 2-core CPU runs E4 and E2 to a small fraction
of their length and E5 at one rate (the CPU runs, their commands and times are in
``docs/guides/reproduce.md``); this
program runs them at the config's settings (the papers' where they give them) on whatever
JAX finds, one ``python -m experiments.main`` process per run, and writes what each took:

* ``e4_5w1s`` / ``e4_5w5s``: ``experiments/configs/omniglot.py`` (1000 rounds of 5 local
  steps, 3 seeds, Local-SCGDM, Local-BSGD, Local-SCGD), 5-way 1-shot and 5-way 5-shot;
* ``e4_20w1s`` / ``e4_20w5s``: the same at 20-way 1-shot and 5-shot (the 1-shot run's 33
  second-order clients together peak at about 21 GB, the 5-shot run's more; on a smaller
  device add ``--config.client_chunk``);
* ``e5``: ``experiments/configs/imbalanced_cifar.py`` (120 rounds, the rate divided by 10
  after 90 as in the paper, ResNet20, 8 clients, six methods, 3 seeds; the learning rate
  0.01 of the config); ``e5_lr0.001``, ``e5_lr0.05``, ``e5_lr0.1``: the rest of the paper's
  rate grid, which it tunes per method; ``e5_local_steps``: the paper's Fig. 3, FedDRO and
  DS-FedDRO at ``I = 1, 2, 4, 8, 16, 32`` (the config's ``ablation=local_steps``);
* ``e2``: ``experiments/configs/personalized_cifar.py`` (300 rounds of 5 local steps, CNN4,
  10 clients, seven methods, 3 seeds).

``--scale`` multiplies every run's rounds (and its ``eval_every``, ``lr_drop_round``), so a
short device lease can take a measured fraction; runs are resumable (the experiment's
checkpoints under ``--workdir``), so calling it again with the same ``--workdir`` and
``--scale`` goes on where a lease ended. The JSON holds, per run, its command, return code,
wall seconds, rounds, and its results table (``summary.json``'s ``table``), plus the
machine; it is rewritten (atomically) after every run, so a lease that ends mid-way keeps
the finished ones.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Tuple

from absl import app, flags

from benchmarks import _common as C

# name: (config file, {field: value} overrides of the config's paper settings, data file)
RUNS: Dict[str, tuple] = {
  "e4_5w1s": ("omniglot.py", {}, "omniglot"),
  "e4_5w5s": ("omniglot.py", {"shots": 5}, "omniglot"),
  "e4_20w1s": ("omniglot.py", {"ways": 20}, "omniglot"),
  "e4_20w5s": ("omniglot.py", {"ways": 20, "shots": 5}, "omniglot"),
  "e5": ("imbalanced_cifar.py", {}, "cifar10_jpeg/cifar10_jpeg.tar.gz"),
  # the rest of the paper's rate grid {0.001, 0.01, 0.05, 0.1} (it tunes each method's)
  **{
    f"e5_lr{rate:g}": (
      "imbalanced_cifar.py",
      {"learning_rate": rate},
      "cifar10_jpeg/cifar10_jpeg.tar.gz",
    )
    for rate in (0.001, 0.05, 0.1)
  },
  # the paper's Fig. 3: FedDRO and DS-FedDRO at I = 1, 2, 4, 8, 16, 32
  "e5_local_steps": (
    "imbalanced_cifar.py",
    {"ablation": "local_steps"},
    "cifar10_jpeg/cifar10_jpeg.tar.gz",
  ),
  "e2": ("personalized_cifar.py", {}, "cifar10_jpeg/cifar10_jpeg.tar.gz"),
}
# The fields that count rounds, scaled with them (their full-length values: the config's).
ROUND_FIELDS = {
  "omniglot.py": ("eval_every",),
  "imbalanced_cifar.py": ("eval_every", "lr_drop_round"),
  "personalized_cifar.py": ("eval_every",),
}

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The program's flags, defined when it runs (importing it defines none: tests import it
  beside other programs' flags)."""
  flags.DEFINE_string("out", None, "Where to write the JSON.", required=True)
  flags.DEFINE_list("runs", list(RUNS), f"Which runs, in order: {', '.join(RUNS)}.")
  flags.DEFINE_float("scale", 1.0, "Fraction of each run's rounds (0 < scale <= 1).")
  flags.DEFINE_string(
    "data_root",
    os.path.join(os.path.dirname(C.ROOT), "shared", "data"),
    "The folder holding omniglot/ and cifar10_jpeg/ (../shared/data).",
  )
  flags.DEFINE_string("workdir", "runs/paper_images", "Parent of each run's resumable workdir.")
  flags.DEFINE_integer("timeout", 0, "Seconds per run before it is stopped (0: none).")


def command(name: str, scale: float, data_root: str, workdir: str) -> Tuple[List[str], str]:
  """The ``experiments.main`` command line of one run at ``scale`` of its length, and the
  run's workdir."""
  config, overrides, data = RUNS[name]
  full = importlib.import_module(f"experiments.configs.{config[:-3]}").get_config()
  rounds = max(1, round(full.rounds * scale))
  fields = {"rounds": rounds, **overrides}
  for field in ROUND_FIELDS[config]:
    fields[field] = max(1, min(rounds, round(full[field] * scale)))
  run_dir = os.path.join(workdir, f"{name}_scale{scale:g}")
  return [
    sys.executable,
    "-m",
    "experiments.main",
    f"--config={os.path.join(C.ROOT, 'experiments', 'configs', config)}",
    f"--config.data_dir={os.path.join(data_root, data)}",
    f"--workdir={run_dir}",
    "--noprogress",
    *[f"--config.{k}={v}" for k, v in fields.items()],
  ], run_dir


def check_flags() -> None:
  unknown = [r for r in FLAGS.runs if r not in RUNS]
  if unknown:
    raise ValueError(f"--runs: unknown {unknown}; allowed: {', '.join(RUNS)}")
  if not 0.0 < FLAGS.scale <= 1.0:
    raise ValueError(f"--scale must be in (0, 1], got {FLAGS.scale}")
  for name in FLAGS.runs:
    path = os.path.join(FLAGS.data_root, RUNS[name][2])
    if not os.path.exists(path):
      raise FileNotFoundError(f"--data_root={FLAGS.data_root!r}: {name} needs {path}")
  if FLAGS.timeout < 0:
    raise ValueError(f"--timeout must be >= 0 seconds, got {FLAGS.timeout}")


def main(argv):
  del argv
  try:
    check_flags()
  except (ValueError, FileNotFoundError) as err:
    sys.exit(f"error: {err}")  # one line, exit status 1
  out = {"machine": C.machine_info(), "started": C.timestamp(), "scale": FLAGS.scale, "runs": {}}
  for name in FLAGS.runs:
    cmd, run_dir = command(name, FLAGS.scale, FLAGS.data_root, FLAGS.workdir)
    t0 = time.perf_counter()
    try:
      proc = subprocess.run(cmd, cwd=C.ROOT, timeout=FLAGS.timeout or None, check=False)
      rc = proc.returncode
    except subprocess.TimeoutExpired:
      rc = "timeout"
    run = {"command": " ".join(cmd[1:]), "rc": rc, "wall_seconds": time.perf_counter() - t0}
    summary = os.path.join(run_dir, "summary.json")
    if rc == 0 and os.path.exists(summary):
      with open(summary) as f:
        done = json.load(f)
      run.update(table=done.get("table"), rounds=done.get("rounds"), seeds=done.get("seeds"))
    out["runs"][name] = run
    out["load_average_end"] = C.load_average()
    C.write_json(FLAGS.out, out)  # after every run: a lease that ends keeps the finished ones
    print(f"{name}: rc {rc}, {run['wall_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main)
