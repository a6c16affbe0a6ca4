r"""fedco against Flower, pfl-research and DrJAX on the same workloads (issue 17).

    python -m benchmarks.peers.run --python_flower=/path/to/flower-venv/bin/python \
        --python_pfl=/path/to/pfl-venv/bin/python --repeats=3 \
        --out=benchmarks/results/peers.json

Each peer program (``benchmarks/peers/<peer>_bench.py``, ``jax_bench.py`` for fedco and
DrJAX) runs in its own process, with its own virtual environment's python (Flower and pfl pin
older packages than fedco's); the repeats alternate between the sides (side A, B, C, A, B,
C, ...), so load changes hit every side alike. Per workload and side it records every
repeat's whole-process wall time (start-up, imports, data, compilation, the rounds), the
program's own ``setup_seconds`` and per-round times, then medians: steady-state rounds per
second (``1 / median`` of the round times after the first), client updates per second
(sampled clients x rounds/s) and the whole-process time; ratios are fedco's over each peer's.
``check`` compares each peer's final model after 3 whole-data FedAvg rounds with fedco's (the
same numbers up to float32 round-off). Writes the JSON (``--out``) and a markdown table
beside it (``.md``). A side whose python is not given is skipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np
from absl import app, flags

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import workloads  # noqa: E402  pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_string("python_flower", None, "python of a virtualenv with flwr[simulation], torch")
flags.DEFINE_string("python_pfl", None, "python of a virtualenv with pfl[pytorch]")
flags.DEFINE_string("python_jax", sys.executable, "python with fedco and drjax")
flags.DEFINE_string(
  "python_fedjax", None, "python of a virtualenv with fedjax (requirements-fedjax.txt)"
)
flags.DEFINE_list(
  "workloads",
  ["check", "logistic", "feddro", "cross_device"],
  "Workloads (also: shakespeare, shakespeare_steps; FedJAX's comparison, issue 45).",
)
flags.DEFINE_integer("repeats", 3, "Processes per side and workload, alternating.")
flags.DEFINE_integer("logistic_rounds", 100, "Timed rounds of the logistic workloads.")
flags.DEFINE_integer("feddro_rounds", 20, "Timed FedDRO rounds (Flower and pfl: 5 of theirs each).")
flags.DEFINE_integer("cross_device_rounds", 10, "Timed rounds of the cross-device workload.")
flags.DEFINE_integer("shakespeare_rounds", 5, "Timed rounds of the Shakespeare workloads.")
flags.DEFINE_list("sides", [], "Only these sides (default: every side whose python is given).")
flags.DEFINE_string("out", "benchmarks/results/peers.json", "Where to write the JSON.")
flags.DEFINE_bool(
  "resummarize",
  False,
  "Recompute the summary and table of --out from its recorded runs (no new runs).",
)

SIDES = {  # side: (python flag, program, extra arguments)
  "fedco": ("python_jax", "jax_bench.py", ["--peer=fedco"]),
  "fedco_xla_conv": ("python_jax", "jax_bench.py", ["--peer=fedco", "--conv_impl=xla"]),
  "drjax": ("python_jax", "jax_bench.py", ["--peer=drjax"]),
  "flower": ("python_flower", "flower_bench.py", []),
  "pfl": ("python_pfl", "pfl_bench.py", []),
  "fedjax": ("python_fedjax", "fedjax_bench.py", []),
  # fedco's Shakespeare sides: clients one at a time (the default), 10 at a time (vmapped,
  # each to its own steps, masked), every client vmapped over the cap (fixed steps only)
  "fedco_chunk10": ("python_jax", "fedco_shakespeare.py", ["--client_chunk=10"]),
  "fedco_vmapped": ("python_jax", "fedco_shakespeare.py", ["--client_chunk=0"]),
}
SHAKESPEARE = ("shakespeare", "shakespeare_steps")
APPLIES = {
  "fedco_xla_conv": ("cross_device",),
  "drjax": ("check", "logistic", "cross_device"),
  "fedjax": SHAKESPEARE,
  "fedco_chunk10": SHAKESPEARE,
  "fedco_vmapped": ("shakespeare_steps",),
  "flower": ("check", "logistic", "feddro", "cross_device"),
  "pfl": ("check", "logistic", "feddro", "cross_device"),
}
# The Shakespeare sides share the rounds' client ids: fedco's side writes them (its first
# run), the others read them.
SCHEDULE = os.path.join(tempfile.gettempdir(), "fedco_peers_shakespeare_{workload}.json")


def run_side(side: str, workload: str, rounds: int) -> Dict[str, Any]:
  python_flag, program, extra = SIDES[side]
  if workload in SHAKESPEARE:
    schedule = SCHEDULE.format(workload=workload)
    if side == "fedco":
      program, extra = "fedco_shakespeare.py", ["--client_chunk=1", f"--schedule_out={schedule}"]
    elif side != "fedjax" and not side.startswith("fedco"):
      raise ValueError(f"side {side} has no Shakespeare program")
    elif side == "fedjax":
      extra = [f"--schedule={schedule}"]
  command = [
    getattr(FLAGS, python_flag),
    os.path.join(HERE, program),
    f"--workload={workload}",
    f"--rounds={rounds}",
    *extra,
  ]
  start = time.perf_counter()
  try:
    env = dict(os.environ)
    if side == "fedjax":  # its jax 0.4.23 aborts on XLA flags it does not know
      env.pop("XLA_FLAGS", None)
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
  except subprocess.TimeoutExpired:
    return {"error": ["timed out after 3600 s"], "process_seconds": 3600.0}
  wall = time.perf_counter() - start
  lines = [l for l in proc.stdout.strip().splitlines() if l.startswith("{")]
  if proc.returncode != 0 or not lines:
    return {
      "error": (proc.stderr or proc.stdout).strip().splitlines()[-3:],
      "process_seconds": wall,
    }
  out = json.loads(lines[-1])
  out["process_seconds"] = wall
  out["load_after"] = list(os.getloadavg())
  return out


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
  ok = [r for r in runs if "error" not in r]
  if not ok:
    return {"error": runs[-1].get("error")}
  if ok[0]["workload"] in SHAKESPEARE:  # rounds differ (their clients): the mean of the same rounds
    steady = [float(np.mean(r["round_seconds"])) for r in ok]
  else:
    steady = [float(np.median(r["round_seconds"][1:] or r["round_seconds"])) for r in ok]
  per_round = float(np.median(steady))
  clients = ok[0]["client_updates_per_round"]
  return {
    "version": ok[0]["version"],
    "repeats": len(ok),
    "rounds_per_second": 1.0 / per_round,
    "client_updates_per_second": clients / per_round,
    "process_seconds": float(
      np.median([r["process_seconds"] - r.get("duplicate_run_seconds", 0.0) for r in ok])
    ),
    "setup_seconds": float(np.median([r["setup_seconds"] for r in ok])),
    "rounds": ok[0]["rounds"],
    **{  # the Shakespeare sides' compile time (fedco: ahead of time; FedJAX: XLA's events)
      k: float(np.median([r[k] for r in ok]))
      for k in ("compile_seconds",)
      if all(k in r for r in ok)
    },
  }


def shakespeare_ratios(sides: Dict[str, Any], runs: Dict[str, List[Dict[str, Any]]]):
  """fedco's rounds/s over FedJAX's, for each fedco side, and whether every side ran the
  same clients and local steps in each round."""
  base = sides.get("fedjax", {})
  ratios = {
    side: s["rounds_per_second"] / base["rounds_per_second"]
    for side, s in sides.items()
    if side.startswith("fedco") and "rounds_per_second" in s and "rounds_per_second" in base
  }
  ok = [r for rs in runs.values() for r in rs if "error" not in r]
  same = lambda k: all(r.get(k) == ok[0].get(k) for r in ok) if ok else None
  return {
    "fedco_over_fedjax": ratios,
    "same_clients": same("round_clients"),
    "same_client_steps": same("client_steps"),
  }


def check_against_fedco(results: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
  ref = next((r for r in results.get("fedco", []) if "final_params" in r), None)
  out = {}
  for side, runs in results.items():
    got = next((r for r in runs if "final_params" in r), None)
    if side == "fedco" or ref is None or got is None:
      continue
    diffs = {
      k: float(
        np.max(np.abs(np.asarray(got["final_params"][k]) - np.asarray(ref["final_params"][k])))
      )
      for k in ("w", "b")
    }
    scale = max(float(np.max(np.abs(np.asarray(ref["final_params"][k])))) for k in ("w", "b"))
    out[side] = {
      "max_abs_diff": max(diffs.values()),
      "max_abs_fedco": scale,
      "equal_to_float32": max(diffs.values()) <= 1e-5 * max(scale, 1.0),
    }
  return out


def table(summary: Dict[str, Any]) -> str:
  lines = [
    "| workload | side | version | rounds/s (steady) | client updates/s | process s "
    "| fedco's speed-up |",
    "| --- | --- | --- | --- | --- | --- | --- |",
  ]
  for workload, sides in summary["workloads"].items():
    if workload == "check":
      continue
    base = sides.get("fedco", {})
    for side, s in sides.items():
      if "error" in s:
        lines.append(f"| {workload} | {side} | - | failed | | | |")
        continue
      ratio = (
        ""
        if side == "fedco" or "rounds_per_second" not in base
        else f"{base['rounds_per_second'] / s['rounds_per_second']:.1f}x rounds/s, "
        f"{s['process_seconds'] / base['process_seconds']:.1f}x process"
      )
      lines.append(
        f"| {workload} | {side} | {s['version']} | {s['rounds_per_second']:.3g} | "
        f"{s['client_updates_per_second']:.3g} | {s['process_seconds']:.1f} | "
        f"{ratio} |"
      )
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  sys.path.insert(0, ROOT)
  from benchmarks import _common  # pylint: disable=g-import-not-at-top

  unknown = [s for s in FLAGS.sides if s not in SIDES]
  if unknown:
    raise app.UsageError(f"--sides: unknown {unknown}; allowed: {', '.join(SIDES)}")
  if FLAGS.resummarize:
    with open(FLAGS.out) as f:
      record = json.load(f)
    for workload, by_side in record["runs"].items():
      if workload != "check":
        record["workloads"][workload] = {s: summarize(rs) for s, rs in by_side.items()}
        if workload in SHAKESPEARE:
          record.setdefault("ratios", {})[workload] = shakespeare_ratios(
            record["workloads"][workload], by_side
          )
    _write(record)
    return
  rounds = {
    "logistic": FLAGS.logistic_rounds,
    "feddro": FLAGS.feddro_rounds,
    "cross_device": FLAGS.cross_device_rounds,
    "shakespeare": FLAGS.shakespeare_rounds,
    "shakespeare_steps": FLAGS.shakespeare_rounds,
    "check": 3,
  }
  record = {
    "machine": _common.machine_info(),
    "started": _common.timestamp(),
    "load_before": list(os.getloadavg()),
    "workloads": {},
    "runs": {},
  }
  for workload in FLAGS.workloads:
    sides = [
      s
      for s in SIDES
      if getattr(FLAGS, SIDES[s][0])
      and workload in APPLIES.get(s, (workload,))
      and (not FLAGS.sides or s in FLAGS.sides)
    ]
    results: Dict[str, List[Dict[str, Any]]] = {s: [] for s in sides}
    repeats = 1 if workload == "check" else FLAGS.repeats
    for i in range(repeats):
      for side in sides if i % 2 == 0 else sides[::-1]:
        results[side].append(run_side(side, workload, rounds[workload]))
        print(
          workload,
          side,
          i,
          {
            k: v
            for k, v in results[side][-1].items()
            if k in ("setup_seconds", "process_seconds", "error")
          },
          flush=True,
        )
    record["runs"][workload] = {
      s: [{k: v for k, v in r.items() if k != "final_params"} for r in rs]
      for s, rs in results.items()
    }
    if workload == "check":
      record["workloads"]["check"] = check_against_fedco(results)
    else:
      record["workloads"][workload] = {s: summarize(rs) for s, rs in results.items()}
      if workload in SHAKESPEARE:
        record["ratios"] = record.get("ratios", {})
        record["ratios"][workload] = shakespeare_ratios(record["workloads"][workload], results)
    # Written whole after every workload: a long run stopped later keeps what it measured.
    record["load_after"] = list(os.getloadavg())
    record["config"] = {
      "repeats": FLAGS.repeats,
      "rounds": rounds,
      "workloads": {k: dataclasses.asdict(w) for k, w in workloads.WORKLOADS.items()},
    }
    record["finished"] = list(record["runs"]) == list(FLAGS.workloads)
    _write(record)


def _write(record):
  from benchmarks import _common  # pylint: disable=g-import-not-at-top

  _common.write_json(FLAGS.out, record)
  md = table(record)
  with open(os.path.splitext(FLAGS.out)[0] + ".md", "w") as f:
    f.write(md)
  print(md)


if __name__ == "__main__":
  app.run(main)
