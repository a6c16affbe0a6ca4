"""Sinusoid tasks (fedco.data.sinusoid), the MLP, and E3 (experiments.sinusoid) end to end."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import common, sinusoid
from fedco.data import sinusoid as sd
from fedco.models.mlp import MLP, init_mlp


def test_training_tasks_are_the_grid_split_evenly():
  tasks = sd.assign_tasks(5, seed=0)
  assert tasks.task_id.shape == (5, 5)
  assert sorted(tasks.task_id.ravel().tolist()) == list(range(25))
  pairs = {(float(a), float(b)) for a, b in zip(tasks.amplitude.ravel(), tasks.phase.ravel())}
  assert pairs == {(a, b) for a in range(1, 6) for b in range(1, 6)}
  again, other = sd.assign_tasks(5, seed=0), sd.assign_tasks(5, seed=1)
  np.testing.assert_array_equal(again.task_id, tasks.task_id)
  assert not np.array_equal(other.task_id, tasks.task_id)
  with pytest.raises(ValueError, match="num_clients"):
    sd.assign_tasks(4)


def test_episodes_hold_every_task_of_the_client_and_a_three_task_meta_batch():
  fed, tasks = sd.federated(3, episodes_per_client=200)
  assert fed.num_clients == 5 and np.all(np.asarray(fed.counts) == 200)
  for k in range(5):
    ep = fed.client(k)
    assert ep["support_x"].shape == (200, 5, 10, 1) and ep["query_y"].shape == (200, 5, 10, 1)
    np.testing.assert_array_equal(np.asarray(ep["task_id"]),
                                  np.broadcast_to(tasks.task_id[k], (200, 5)))
    for split in ("support", "query"):
      x, y = np.asarray(ep[f"{split}_x"]), np.asarray(ep[f"{split}_y"])
      assert x.min() >= -5 and x.max() <= 5
      expected = tasks.amplitude[k][None, :, None, None] * np.sin(
          x + tasks.phase[k][None, :, None, None] * np.pi / 5)
      np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    w = np.asarray(ep["task_weight"])
    np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-6)
    assert np.all((w > 0).sum(1) == 3)
    assert np.all((w > 0).mean(0) > 0.4)  # every task is sampled (3/5 of the time)
    # support and query are independent draws
    assert not np.allclose(np.asarray(ep["support_x"]), np.asarray(ep["query_x"]))


def test_unseen_tasks_and_training_evaluation_episode():
  test = sd.unseen_tasks(0)
  assert test["support_x"].shape == (600, 10, 1) and test["amplitude"].shape == (600,)
  assert 0.1 <= test["amplitude"].min() and test["amplitude"].max() <= 5
  assert 0 <= test["phase"].min() and test["phase"].max() <= 5
  np.testing.assert_allclose(
      test["query_y"][..., 0],
      test["amplitude"][:, None] * np.sin(test["query_x"][..., 0]
                                          + test["phase"][:, None] * np.pi / 5), atol=1e-5)
  np.testing.assert_allclose(test["task_weight"].sum(), 1.0, rtol=1e-5)
  # the training evaluation set does not depend on how the tasks were split
  a = sd.training_eval_episode(sd.assign_tasks(5, 0), seed=7)
  b = sd.training_eval_episode(sd.assign_tasks(5, 1), seed=7)
  assert a["support_x"].shape == (100, 10, 1)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])


def test_mlp_takes_one_example_or_a_batch():
  model = MLP()
  params = init_mlp(model, 1, seed=0)
  assert sum(x.size for x in jax.tree.leaves(params)) == 1 * 40 + 40 + 40 * 40 + 40 + 40 + 1
  apply = jax.jit(model.apply)
  assert apply(params, jnp.ones((1,))).shape == (1,)
  assert apply(params, jnp.asarray(0.5)).shape == (1,)
  batch = jnp.linspace(-5, 5, 7)[:, None]
  out = apply(params, batch)
  assert out.shape == (7, 1)
  np.testing.assert_allclose(out[3], apply(params, batch[3]), rtol=1e-6)
  wide = MLP(hidden=(3, 4, 5), out=2)
  assert jax.eval_shape(wide.apply, init_mlp(wide, 2), jnp.ones((2,))).shape == (2,)


TINY = dict(iterations=10, p=5, eval_every=1, seeds=(0,), test_tasks=16,
            episodes_per_client=12, hidden=(8, 8), progress=False)


def _outputs(workdir):
  for name in ("config.json", "metrics.jsonl", "summary.json", "mse.png", "fit.png"):
    assert os.path.exists(os.path.join(workdir, name)), name
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  return summary, common.read_jsonl(os.path.join(workdir, "metrics.jsonl"))


def test_e3_end_to_end_with_tiny_settings(tmp_path):
  # two algorithms keep the test fast (each is one XLA compilation); the other two run under
  # fedco.simulate in tests/test_maml.py and are built below
  algorithms = ("local_scgdm", "local_bsgd")
  summary = sinusoid.run(str(tmp_path), **TINY, algorithms=algorithms)
  written, records = _outputs(str(tmp_path))
  assert set(written["algorithms"]) == set(algorithms)
  assert {r["iteration"] for r in records} == {5, 10}
  for r in records:
    for key in ("train_mse", "val_mse", "val_mse_before"):
      assert np.isfinite(r[key]) and r[key] > 0
  for label in algorithms:
    entry = written["algorithms"][label]
    assert entry["val_mse"]["mean"] == pytest.approx(entry["per_seed"]["0"]["val_mse"])
    assert entry["diverged_seeds"] == []
  assert set(written["scgdm_val_below_local_bsgd"]) == {"0"}
  assert summary["wall_seconds"] > 0
  with open(os.path.join(str(tmp_path), "config.json")) as f:
    assert json.load(f)["inner_lr"] == 0.001


def test_e3_builds_each_algorithm_with_the_paper_settings(tmp_path):
  config = sinusoid.validate(str(tmp_path))
  specs = {s["algorithm"]: s for s in sinusoid.runs(config)}
  assert set(specs) == set(sinusoid.ALGORITHMS)
  names = {"local_scgdm": "local_scgdm", "local_bsgd": "comfedl", "local_scgd": "local_scgd",
           "local_moml": "local_moml"}
  for label, spec in specs.items():
    alg = sinusoid.make_algorithm(spec, config)
    assert alg.name == names[label] and alg.plan.local_steps == 5
  assert sinusoid.make_algorithm(specs["local_scgdm"], config).plan.every_round == ("u", "m")
  assert sinusoid.make_algorithm(specs["local_moml"], config).plan.every_round == ()
  for sweep, key in (("gamma", "gamma"), ("alpha", "alpha"), ("p", "p")):
    specs = sinusoid.runs(sinusoid.validate(str(tmp_path), sweep=sweep))
    assert [s[key] for s in specs] == list(sinusoid.SWEEP_DEFAULTS[sweep])
    assert all(s["algorithm"] == "local_scgdm" for s in specs)


def test_e3_p_sweep_keeps_the_iterations(tmp_path):
  sinusoid.run(str(tmp_path), **{**TINY, "sweep": "p", "sweep_values": ("1",)})
  summary, records = _outputs(str(tmp_path))
  assert set(summary["algorithms"]) == {"local_scgdm_p=1"}
  assert max(r["iteration"] for r in records if r["algorithm"] == "local_scgdm_p=1") == 10


@pytest.mark.parametrize("kwargs,flag", [
    (dict(algorithms=("local_scgdm", "maml")), "--algorithms"),
    (dict(iterations=12, p=5), "--iterations"),
    (dict(iterations=0), "--iterations"),
    (dict(gamma=1.0), "--gamma"),
    (dict(alpha=0.8, eta=2.0), "--alpha"),
    (dict(beta=0.0), "--beta"),
    (dict(inner_lr=-0.001), "--inner_lr"),
    (dict(scgd_gamma=1.5), "--scgd_gamma"),
    (dict(moml_beta=0.0), "--moml_beta"),
    (dict(num_clients=4), "--num_clients"),
    (dict(tasks_per_step=6), "--tasks_per_step"),
    (dict(hidden=("40", "0")), "--hidden"),
    (dict(hidden=("x",)), "--hidden"),
    (dict(seeds=("a",)), "--seeds"),
    (dict(seeds=("0", "0")), "--seeds"),
    (dict(sweep="lr"), "--sweep"),
    (dict(sweep="p", sweep_values=("7",)), "--sweep_values"),
    (dict(sweep="gamma", sweep_values=("1.2",)), "--sweep_values"),
    (dict(sweep="alpha", sweep_values=("x",)), "--sweep_values"),
    (dict(first_order="yes"), "--first_order"),
])
def test_bad_flags_raise_naming_the_flag(tmp_path, kwargs, flag):
  with pytest.raises(ValueError, match=flag):
    sinusoid.validate(str(tmp_path), **kwargs)


def test_bad_workdir_raises():
  with pytest.raises(ValueError, match="--workdir"):
    sinusoid.validate("")
