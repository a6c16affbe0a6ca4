"""fedco.sweep: a grid times seeds in one vmapped program equals the separate runs; a
diverging run is frozen and reported without touching the others."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.problems import portfolio
from tests import helpers

GRID = {"learning_rate": [0.05, 0.2, 40.0], "beta": [0.5, 0.9]}
SEEDS = [0, 3]
ROUNDS = 7


def _data():
  return fedco.FederatedData.from_clients(
    [{"r": c} for c in helpers.portfolio_clients(sizes=(24, 8, 40, 12), seed=1)]
  )


@functools.lru_cache(maxsize=None)
def _swept():
  return fedco.sweep(
    portfolio(1.0),
    fedco.feddro,
    _data(),
    jnp.zeros(3),
    rounds=ROUNDS,
    grid=GRID,
    seeds=SEEDS,
    algorithm_kwargs={"local_steps": 3},
    chunk_rounds=4,
    batch_size=4,
    clients_per_round=3,
    eval_every=2,
  )


def test_runs_are_the_grid_times_the_seeds():
  runs = _swept().runs
  assert len(runs) == 3 * 2 * 2
  assert runs[0] == {"learning_rate": 0.05, "beta": 0.5, "seed": 0}
  assert runs[1] == {"learning_rate": 0.05, "beta": 0.5, "seed": 3}
  assert {(r["learning_rate"], r["beta"], r["seed"]) for r in runs} == {
    (lr, b, s) for lr in GRID["learning_rate"] for b in GRID["beta"] for s in SEEDS
  }


def test_each_run_equals_its_separate_simulate_call():
  swept = _swept()
  compared = 0
  for r, run in enumerate(swept.runs):
    if swept.diverged[r] is not None:
      continue
    alone = fedco.simulate(
      portfolio(1.0),
      fedco.feddro(run["learning_rate"], 3, beta=run["beta"]),
      _data(),
      jnp.zeros(3),
      rounds=ROUNDS,
      seed=run["seed"],
      batch_size=4,
      clients_per_round=3,
      eval_every=2,
    )
    np.testing.assert_allclose(
      np.asarray(swept.params[r]), np.asarray(alone.params), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
      swept.metrics["objective"][r], alone.metrics["objective"], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(swept.metrics["clients"][r], alone.metrics["clients"])
    np.testing.assert_allclose(
      np.asarray(swept.random_params[r]), np.asarray(alone.random_params), rtol=1e-5, atol=1e-6
    )
    assert swept.ledgers[r] == alone.ledger
    compared += 1
  assert compared == 8  # every run but the four at learning rate 40


def test_a_diverging_run_is_frozen_and_reported_and_does_not_poison_the_others():
  swept = _swept()
  for r, run in enumerate(swept.runs):
    if run["learning_rate"] == 40.0:
      report = swept.diverged[r]
      assert report is not None and 1 <= report["round"] <= ROUNDS
      assert report["quantity"] in ("state", "objective", "client_losses")
      frozen = np.asarray(swept.params[r])
      assert np.all(np.isfinite(frozen))  # its last finite state
      after = swept.metrics["objective"][r][report["round"] :]
      assert np.all(np.isnan(after))
      with pytest.raises(fedco.runtime.NonFiniteError):  # the separate run does diverge
        fedco.simulate(
          portfolio(1.0),
          fedco.feddro(40.0, 3, beta=run["beta"]),
          _data(),
          jnp.zeros(3),
          rounds=ROUNDS,
          seed=run["seed"],
          batch_size=4,
          clients_per_round=3,
          eval_every=2,
        )
    else:
      assert swept.diverged[r] is None
      assert np.all(np.isfinite(swept.metrics["objective"][r][1::2]))


def test_bad_grids_are_clear_errors():
  data = _data()
  for grid, match in (
    ({"local_steps": [1, 2]}, "local_steps"),
    ({"learning_rate": []}, "learning_rate"),
    ({"momentum": [0.1]}, "momentum"),
    ({"beta": [0.5, float("nan")]}, "beta"),
  ):
    with pytest.raises(ValueError, match=match):
      fedco.sweep(portfolio(1.0), fedco.feddro, data, jnp.zeros(3), rounds=2, grid=grid)
  with pytest.raises(ValueError, match="seeds"):
    fedco.sweep(portfolio(1.0), fedco.feddro, data, jnp.zeros(3), rounds=2, seeds=[])


def test_the_random_iterate_is_a_uniformly_random_round():
  """Over 400 seeds, the round whose model ``random_params`` holds is uniform over the 8
  rounds (chi-square goodness of fit); a sampler that kept the last round, or favoured
  early ones, fails."""
  from scipy import stats

  rounds, seeds = 8, 400
  swept = fedco.sweep(
    portfolio(1.0),
    fedco.feddro,
    _data(),
    jnp.zeros(3),
    rounds=rounds,
    seeds=range(seeds),
    algorithm_kwargs={"learning_rate": 0.1, "local_steps": 2},
    batch_size=2,
    evaluate=False,
    metrics_fn=lambda p: {"x": p},
  )
  models = np.asarray(swept.metrics["x"])  # [seeds, rounds, d]
  chosen = np.asarray(swept.random_params)[:, None, :]  # [seeds, 1, d]
  match = np.all(models == chosen, axis=-1)
  assert np.all(match.sum(axis=1) == 1)  # every run's random model is exactly one round's
  counts = np.bincount(np.argmax(match, axis=1), minlength=rounds)
  assert stats.chisquare(counts).pvalue > 1e-3, counts


# ---- seeds of one algorithm, each with its own data, as one program ----------------------


def _seed_data(seed):
  """A seed's own clients (same sizes, other returns): stackable with the others'."""
  return fedco.FederatedData.from_clients(
    [{"r": c} for c in helpers.portfolio_clients(sizes=(24, 8, 40, 12), seed=seed)]
  )


SEED_KW = dict(
  rounds=6,
  batch_size=4,
  clients_per_round=3,
  eval_every=2,
  metrics_fn=lambda p, d: {"shift": jnp.sum(p * d["w"])},
)


def _per_seed(**extra):
  seeds = (0, 5)
  return fedco.sweep(
    portfolio(1.0),
    fedco.feddro(0.05, 3),
    fedco.runtime.PerSeed([_seed_data(s) for s in seeds]),
    fedco.runtime.PerSeed([jnp.full(3, 0.1 * s) for s in seeds]),
    seeds=seeds,
    metrics_data=fedco.runtime.PerSeed([{"w": jnp.arange(3.0) + s} for s in seeds]),
    **SEED_KW,
    **extra,
  )


def test_per_seed_data_params_and_metrics_data_equal_each_seeds_own_simulate_call():
  swept = _per_seed()
  assert [r["seed"] for r in swept.runs] == [0, 5]
  for r, s in enumerate((0, 5)):
    alone = fedco.simulate(
      portfolio(1.0),
      fedco.feddro(0.05, 3),
      _seed_data(s),
      jnp.full(3, 0.1 * s),
      seed=s,
      metrics_data={"w": jnp.arange(3.0) + s},
      **SEED_KW,
    )
    one = swept.simulation(r)
    np.testing.assert_allclose(
      np.asarray(one.params), np.asarray(alone.params), rtol=1e-5, atol=1e-6
    )
    for key in ("objective", "shift"):
      np.testing.assert_allclose(one.metrics[key], alone.metrics[key], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(one.metrics["clients"], alone.metrics["clients"])
    assert one.ledger == alone.ledger


def test_per_seed_values_of_other_shapes_or_counts_are_refused():
  with pytest.raises(ValueError, match="data: seed 5's value has other shapes"):
    fedco.sweep(
      portfolio(1.0),
      fedco.feddro(0.05, 3),
      fedco.runtime.PerSeed(
        [
          _seed_data(0),
          fedco.FederatedData.from_clients(
            [{"r": c} for c in helpers.portfolio_clients(sizes=(24, 8, 41, 12))]
          ),
        ]
      ),
      jnp.zeros(3),
      seeds=(0, 5),
      rounds=2,
    )
  with pytest.raises(ValueError, match="params: PerSeed holds 1 values for 2 seeds"):
    fedco.sweep(
      portfolio(1.0),
      fedco.feddro(0.05, 3),
      _data(),
      fedco.runtime.PerSeed([jnp.zeros(3)]),
      seeds=(0, 5),
      rounds=2,
    )
  with pytest.raises(ValueError, match="grid: 'beta' needs an algorithm factory"):
    fedco.sweep(
      portfolio(1.0), fedco.feddro(0.05, 3), _data(), jnp.zeros(3), grid={"beta": [0.5]}, rounds=2
    )


class _Rows(fedco.runtime.RowWriter):
  def __init__(self):
    self.rows = []

  def write(self, rows):
    self.rows.extend(rows)

  def rewind(self, round_, labels):
    self.rows = [
      r
      for r in self.rows
      if not (r["round"] > round_ and all(r.get(k) == v for k, v in labels.items()))
    ]


def test_each_runs_rows_reach_the_writers_with_its_labels():
  writer = _Rows()
  swept = _per_seed(
    metric_writers=[writer], metric_labels=[{"method": "m", "seed": 0}, {"method": "m", "seed": 5}]
  )
  for r, s in enumerate((0, 5)):
    rows = [row for row in writer.rows if row["seed"] == s]
    assert [row["round"] for row in rows] == [1, 2, 4, 6]
    assert all(row["method"] == "m" for row in rows)
    np.testing.assert_allclose(
      [row["objective"] for row in rows], swept.metrics["objective"][r][[0, 1, 3, 5]]
    )


def test_a_sweep_resumes_from_its_checkpoint_as_if_never_stopped(tmp_path):
  import os
  import signal

  whole = _per_seed()

  class StopAfterFirstChunk(_Rows):
    def write(self, rows):
      super().write(rows)
      if max(r["round"] for r in self.rows) == 2:
        os.kill(os.getpid(), signal.SIGINT)

  stopping = StopAfterFirstChunk()
  with pytest.raises(fedco.runtime.Interrupted, match="after round 2 of 6"):
    _per_seed(checkpoint_dir=tmp_path, checkpoint_every=2, metric_writers=[stopping])
  resumed_rows = _Rows()
  resumed_rows.rows = list(stopping.rows)
  resumed = _per_seed(checkpoint_dir=tmp_path, checkpoint_every=2, metric_writers=[resumed_rows])
  for key in ("objective", "shift", "clients"):
    np.testing.assert_array_equal(resumed.metrics[key], whole.metrics[key])
  np.testing.assert_array_equal(np.asarray(resumed.params), np.asarray(whole.params))
  assert sorted((r["seed"], r["round"]) for r in resumed_rows.rows) == sorted(
    (s, t) for s in (0, 5) for t in (1, 2, 4, 6)
  )
  with pytest.raises(fedco.checkpoint.RunMismatchError):  # another sweep's checkpoints
    fedco.sweep(
      portfolio(1.0),
      fedco.feddro(0.07, 3),
      _data(),
      jnp.zeros(3),
      seeds=(0, 5),
      checkpoint_dir=tmp_path,
      **SEED_KW,
      metrics_data={"w": jnp.arange(3.0)},
    )


def test_arrays_the_seeds_share_are_not_copied_per_run():
  """Seeds partitioning one dataset differently share its examples (one copy, vmap axis
  None); only their row lists are stacked."""
  examples = {"r": jnp.asarray(np.random.default_rng(0).normal(size=(12, 3)), jnp.float32)}
  parts = [list(np.random.default_rng(s).permutation(12).reshape(3, 4)) for s in (0, 1)]
  value = fedco.runtime.PerSeed([fedco.FederatedData.from_index_lists(examples, p) for p in parts])
  stacked, axes = fedco.runtime.vmapped.per_run("data", value, (0, 1), (0, 1, 0))
  assert stacked.examples["r"] is examples["r"] and axes.examples["r"] is None
  assert axes.flat_rows == 0 and stacked.flat_rows.shape == (3, 12)
  np.testing.assert_array_equal(stacked.flat_rows[2], stacked.flat_rows[0])
  swept = fedco.sweep(
    portfolio(1.0), fedco.feddro(0.05, 3), value, jnp.zeros(3), seeds=(0, 1), rounds=3, batch_size=2
  )
  for r, p in enumerate(parts):
    alone = fedco.simulate(
      portfolio(1.0),
      fedco.feddro(0.05, 3),
      fedco.FederatedData.from_index_lists(examples, p),
      jnp.zeros(3),
      seed=r,
      rounds=3,
      batch_size=2,
    )
    np.testing.assert_allclose(
      swept.metrics["objective"][r], alone.metrics["objective"], rtol=1e-5, atol=1e-6
    )


def test_a_sweep_evaluates_only_on_the_rounds_due():
  """The runs of a sweep evaluate on the same rounds, so the evaluation stays a branch
  taken only when due: a predicate batched over the runs would make ``vmap`` turn
  ``lax.cond`` into a select and evaluate every round (E5's seeds ran 2.2x slower a seed)."""
  calls = []

  def metrics_fn(params):
    jax.debug.callback(lambda: calls.append(1))  # once a run's evaluation executes
    return {"norm": jnp.sum(params**2)}

  kwargs = dict(rounds=12, eval_every=4, chunk_rounds=12, batch_size=4, metrics_fn=metrics_fn)
  swept = fedco.sweep(
    portfolio(1.0), fedco.feddro(0.05, 2), _data(), jnp.zeros(3), seeds=(0, 1), **kwargs
  )
  jax.effects_barrier()
  evaluated = np.asarray(swept.metrics["evaluated"])
  assert evaluated.sum(axis=1).tolist() == [4, 4]  # rounds 1, 4, 8 and 12
  assert len(calls) == 4  # one vmapped evaluation per due round, none on the other 8
  assert (
    np.isnan(swept.metrics["norm"][:, 1]).all() and np.isfinite(swept.metrics["norm"][:, 3]).all()
  )
