r"""Many runs in one program: E1's ComFedL grid as ``fedco.sweep`` against sequential runs.

The grid of paper 001 Sec. 5.3 for ComFedL on E1 (digits, 10 quantity-skewed clients,
logistic regression, tau 5, batch 32, evaluation every 5 rounds with E1's train/validation
accuracy metrics): learning rate {0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 1} x gamma {0.1, 0.5,
1, 5} x 3 seeds = 84 runs of ``--rounds`` rounds.

* ``sequential``: 84 ``fedco.simulate`` calls, one per run (each compiles its own program;
  a run that diverges stops at its first non-finite chunk with ``NonFiniteError``, as E1
  runs them).
* ``sweep``: one ``fedco.sweep`` per gamma (gamma is the problem's KL temperature, fixed in
  a problem), each running 7 learning rates x 3 seeds = 21 runs vmapped in one program.

Both sides use the same partition (seed 0), initial model and simulation seeds, so every
run has a twin. Recorded: wall time of each side including compilation, their ratio, which
runs diverged on each side (and where), and the largest difference between the twins'
final models and final worst-client validation accuracies among runs finite on both sides.

Run::

    python -m benchmarks.sweep --out=benchmarks/results/sweep.json
"""

from __future__ import annotations

import time

import jax
from absl import app, flags

import fedco
from benchmarks import _common as C
from experiments import dro_fl
from fedco import metrics as metrics_lib
from fedco import models

FLAGS = flags.FLAGS
LEARNING_RATES = (0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0)
GAMMAS = (0.1, 0.5, 1.0, 5.0)
SEEDS = (0, 1, 2)


def setup():
  """E1's data, model, initial parameters and metrics on digits (partition seed 0; E1's
  default digits split: 899 training images, a big client of 500, nine of 20)."""
  from experiments.configs import dro_fl as dro_fl_config  # pylint: disable=g-import-not-at-top

  config = dro_fl_config.get_config()
  dro_fl.check(config)  # fills the dataset's defaults (the big client's 500 images on digits)
  splits = dro_fl.load(config)
  fed, _ = dro_fl.build_data((splits.train, splits.test), config, 0)
  model, loss, stats = dro_fl.logistic_model()

  def metrics_fn(p):
    out = {}
    for split, data in (("train", fed.train), ("val", fed.val)):
      _, accs = metrics_lib.per_client_mean(stats, p, data)
      out[f"{split}_acc_avg"], out[f"{split}_acc_worst"] = metrics_lib.summarize(accs, worst="min")
    return out

  params = models.init_params(model, fed.train.examples["x"][0], 0)
  return fed, loss, metrics_fn, params


def run_sequential(fed, loss, metrics_fn, params, rounds, options):
  out = {}
  for gamma in GAMMAS:
    problem = fedco.problems.client_kl_dro(loss, gamma)
    for lr in LEARNING_RATES:
      for seed in SEEDS:
        try:
          res = fedco.simulate(
            problem,
            fedco.comfedl(lr, 5),
            fed.train,
            params,
            rounds=rounds,
            seed=seed,
            metrics_fn=metrics_fn,
            **options,
          )
          out[(gamma, lr, seed)] = {
            "params": res.params,
            "diverged": None,
            "val_acc_worst": float(res.metrics["val_acc_worst"][-1]),
          }
        except fedco.runtime.NonFiniteError as err:
          out[(gamma, lr, seed)] = {"params": None, "diverged": int(err.round)}
  return out


def run_sweep(fed, loss, metrics_fn, params, rounds, options):
  out = {}
  for gamma in GAMMAS:
    problem = fedco.problems.client_kl_dro(loss, gamma)
    res = fedco.sweep(
      problem,
      fedco.comfedl,
      fed.train,
      params,
      rounds=rounds,
      grid={"learning_rate": list(LEARNING_RATES)},
      seeds=list(SEEDS),
      algorithm_kwargs={"local_steps": 5},
      metrics_fn=metrics_fn,
      **options,
    )
    for r, run in enumerate(res.runs):
      report = res.diverged[r]
      out[(gamma, run["learning_rate"], run["seed"])] = {
        "params": None if report else jax.tree.map(lambda a, r=r: a[r], res.params),
        "diverged": report["round"] if report else None,
        "val_acc_worst": float(res.metrics["val_acc_worst"][r][-1]),
      }
  return out


def main(argv):
  del argv
  rounds = FLAGS.rounds
  options = dict(batch_size=32, evaluate=False, eval_every=5)
  fed, loss, metrics_fn, params = setup()
  record = {
    "benchmark": "sweep",
    "timestamp": C.timestamp(),
    "machine": C.machine_info(),
    "config": {
      "rounds": rounds,
      "learning_rates": LEARNING_RATES,
      "gammas": GAMMAS,
      "seeds": SEEDS,
      "runs": len(LEARNING_RATES) * len(GAMMAS) * len(SEEDS),
      "tau": 5,
      "batch_size": 32,
      "eval_every": 5,
      "clients": 10,
      "dataset": "digits (quantity skew 1000/20, partition seed 0)",
    },
  }
  sides = {"sweep": run_sweep, "sequential": run_sequential}
  order = ["sweep", "sequential"] if FLAGS.sweep_first else ["sequential", "sweep"]
  results, seconds = {}, {}
  for name in order:
    start = time.perf_counter()
    results[name] = sides[name](fed, loss, metrics_fn, params, rounds, options)
    seconds[name] = time.perf_counter() - start
    record[f"load_after_{name}"] = C.load_average()
  keys = sorted(results["sweep"])
  both = [
    k
    for k in keys
    if results["sweep"][k]["diverged"] is None and results["sequential"][k]["diverged"] is None
  ]
  record["seconds"] = seconds
  record["sequential_over_sweep"] = seconds["sequential"] / seconds["sweep"]
  record["finite_on_both"] = len(both)
  record["diverged"] = {
    side: {
      f"gamma={g} lr={lr} seed={s}": results[side][(g, lr, s)]["diverged"]
      for g, lr, s in keys
      if results[side][(g, lr, s)]["diverged"] is not None
    }
    for side in sides
  }
  record["same_runs_diverged"] = set(record["diverged"]["sweep"]) == set(
    record["diverged"]["sequential"]
  )
  record["max_abs_diff_final_params"] = max(
    (
      C.max_abs_diff(results["sweep"][k]["params"], results["sequential"][k]["params"])
      for k in both
    ),
    default=None,
  )
  record["max_abs_diff_final_val_acc_worst"] = max(
    (
      abs(results["sweep"][k]["val_acc_worst"] - results["sequential"][k]["val_acc_worst"])
      for k in both
    ),
    default=None,
  )
  print(
    {
      k: record[k]
      for k in (
        "seconds",
        "sequential_over_sweep",
        "finite_on_both",
        "same_runs_diverged",
        "max_abs_diff_final_params",
        "max_abs_diff_final_val_acc_worst",
      )
    }
  )
  C.write_json(FLAGS.out, record)


if __name__ == "__main__":
  flags.DEFINE_integer("rounds", 300, "Rounds per run.")
  flags.DEFINE_boolean("sweep_first", True, "Time the sweep side before the sequential one.")
  flags.DEFINE_string("out", "benchmarks/results/sweep.json", "Where to write the JSON.")
  app.run(main)
