"""Sinusoid tasks (fedco.data.sinusoid), the MLP, and E3 (experiments.sinusoid) end to end."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import sinusoid
from experiments.configs.sinusoid import get_config
from fedco.data import sinusoid as sd
from fedco.experiment import outputs, runner
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
    np.testing.assert_array_equal(
      np.asarray(ep["task_id"]), np.broadcast_to(tasks.task_id[k], (200, 5))
    )
    for split in ("support", "query"):
      x, y = np.asarray(ep[f"{split}_x"]), np.asarray(ep[f"{split}_y"])
      assert x.min() >= -5 and x.max() <= 5
      expected = tasks.amplitude[k][None, :, None, None] * np.sin(
        x + tasks.phase[k][None, :, None, None] * np.pi / 5
      )
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
    test["amplitude"][:, None]
    * np.sin(test["query_x"][..., 0] + test["phase"][:, None] * np.pi / 5),
    atol=1e-5,
  )
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


QUIET = runner.Options(progress=False)


def tiny(**changes):
  """E3 at tiny settings: 2 rounds of 5 local steps, one seed, a small net and test set."""
  config = get_config()
  config.rounds, config.eval_every, config.seeds = 2, 1, (0,)
  config.test_tasks, config.episodes_per_client, config.hidden = 16, 12, (8, 8)
  for name, value in changes.items():
    setattr(config, name, value)
  return config


def _outputs(workdir):
  for name in ("config.json", "metrics.jsonl", "metrics.csv", "summary.json", "mse.png", "fit.png"):
    assert os.path.exists(os.path.join(workdir, name)), name
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  return summary, outputs.read_jsonl(os.path.join(workdir, "metrics.jsonl"))


@pytest.fixture(scope="module")
def e3_tiny(tmp_path_factory):
  """Two methods (each is one XLA compilation; the other two run under fedco.simulate in
  tests/test_maml.py and are built below) for 3 rounds, evaluated every 2 and at the last
  round."""
  workdir = str(tmp_path_factory.mktemp("e3"))
  config = tiny(rounds=3, eval_every=2)
  for label in ("local_scgd", "local_moml"):
    del config.methods[label]
  summary = runner.train_and_evaluate(config, workdir, QUIET)
  return workdir, summary


def test_e3_end_to_end_with_tiny_settings(e3_tiny):
  workdir, summary = e3_tiny
  written, records = _outputs(workdir)
  labels = {"local_scgdm", "comfedl"}
  assert set(written["methods"]) == labels
  assert {r["method"] for r in records} == labels
  assert {r["round"] for r in records} == {1, 2, 3}  # every evaluated round, streamed
  for r in records:
    for key in ("train_mse", "val_mse", "val_mse_before"):
      assert np.isfinite(r[key]) and r[key] > 0
  for label in labels:
    entry = written["methods"][label]
    assert entry["val_mse"]["mean"] == pytest.approx(entry["per_seed"]["0"]["val_mse"])
  assert [row["method"] for row in written["table"]] == ["comfedl", "local_scgdm"]
  assert set(written["local_scgdm_val_below_comfedl"]) == {"0"}
  assert written["settings"]["local_scgdm"]["learning_rate"] == 1.0
  assert written["settings"]["comfedl"]["learning_rate"] == 0.01
  assert summary["wall_seconds"] > 0
  machine = written["machine"]  # results carry the machine they ran on
  assert machine["default_backend"] == jax.default_backend() and machine["cpu_count"] >= 1
  assert machine["cpu_model"] and len(machine["load_average"]) == 3
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["inner_lr"] == 0.001


def test_e3_rounds_past_the_last_evaluation_keep_finite_finals(e3_tiny):
  """3 rounds evaluated every 2: the finals are the last round's (iteration 15), finite,
  and no run is reported as diverged."""
  _, summary = e3_tiny
  for label, entry in summary["methods"].items():
    assert entry["diverged_seeds"] == [], label
    final = entry["per_seed"][0]
    assert final["round"] == 3 and final["iteration"] == 15
    for key in sinusoid.TABLE_KEYS:
      assert np.isfinite(final[key]) and np.isfinite(entry[key]["mean"]), (label, key)
  assert all("note" not in row and row["val_mse"] is not None for row in summary["table"])


def test_e3_builds_each_method_with_the_paper_settings():
  config = get_config()
  assert sinusoid.check(config) is None
  methods = {m.label: m for m in sinusoid.methods(config, None)}
  assert set(methods) == {"local_scgdm", "comfedl", "local_scgd", "local_moml"}
  for method in methods.values():
    alg = method.build()
    assert alg.name == method.algorithm and alg.plan.local_steps == 5
    assert runner.same_iterations(config, method) == {"rounds": 600, "eval_every": 25}
    assert method.settings()["rounds"] == 600 and method.settings()["eval_every"] == 25
  assert methods["local_scgdm"].build().plan.every_round == ("u", "m")
  assert methods["local_moml"].build().plan.every_round == ()
  for ablation in ("gamma", "alpha", "local_steps"):
    config = get_config()
    config.ablation = ablation
    sinusoid.check(config)
    runs = sinusoid.methods(config, None)
    values = [m.local_steps if ablation == "local_steps" else m.kwargs[ablation] for m in runs]
    assert values == list(sinusoid.ABLATION_DEFAULTS[ablation])
    assert all(m.algorithm == "local_scgdm" and m.learning_rate == 1.0 for m in runs)
    assert [m.label for m in runs] == [f"local_scgdm_{ablation}={v:g}" for v in values]
  # the local_steps ablation keeps the 3000 meta-iterations and the evaluation points
  schedules = [
    {"rounds": 3000, "eval_every": 125},
    {"rounds": 1500, "eval_every": 62},
    {"rounds": 600, "eval_every": 25},
    {"rounds": 300, "eval_every": 12},
  ]
  assert [runner.same_iterations(config, m) for m in runs] == schedules
  assert [{k: m.settings()[k] for k in ("rounds", "eval_every")} for m in runs] == schedules


def test_e3_local_steps_ablation_keeps_the_iterations(tmp_path):
  runner.train_and_evaluate(
    tiny(ablation="local_steps", ablation_values=(1,)), str(tmp_path), QUIET
  )
  summary, records = _outputs(str(tmp_path))
  assert set(summary["methods"]) == {"local_scgdm_local_steps=1"}
  assert summary["settings"]["local_scgdm_local_steps=1"]["rounds"] == 10
  assert max(r["round"] for r in records) == 10  # 10 rounds of 1 step = 2 rounds of 5


def _set(config, path, value):
  *parents, name = path.split(".")
  for parent in parents:
    config = config[parent]
  with config.ignore_type():
    setattr(config, name, value)


@pytest.mark.parametrize(
  "changes,field",
  [
    ({"methods.local_scgdm.algorithm": "maml"}, "--config.methods.local_scgdm.algorithm"),
    ({"methods.comfedl.inner_lr": 0.1}, "--config.methods.comfedl.inner_lr"),
    ({"methods.comfedl.local_steps": 7}, "--config.methods.comfedl.local_steps"),
    ({"rounds": 0}, "--config.rounds"),
    ({"eval_every": 0}, "--config.eval_every"),
    ({"methods.local_scgdm.gamma": 1.0}, "--config.methods.local_scgdm.gamma"),
    ({"methods.local_scgdm.learning_rate": 2.0}, "--config.methods.local_scgdm.alpha"),
    ({"methods.local_scgdm.beta": 0.0}, "--config.methods.local_scgdm.beta"),
    ({"inner_lr": -0.001}, "--config.inner_lr"),
    ({"methods.local_scgd.gamma": 1.5}, "--config.methods.local_scgd.gamma"),
    ({"methods.local_moml.beta": 0.0}, "--config.methods.local_moml.beta"),
    ({"num_clients": 4}, "--config.num_clients"),
    ({"tasks_per_step": 6}, "--config.tasks_per_step"),
    ({"hidden": (40, 0)}, "--config.hidden"),
    ({"hidden": ("x",)}, "--config.hidden"),
    ({"seeds": ("a",)}, "--config.seeds"),
    ({"seeds": (0, 0)}, "--config.seeds"),
    ({"ablation": "lr"}, "--config.ablation"),
    ({"ablation": "local_steps", "ablation_values": (7,)}, "--config.ablation_values"),
    ({"ablation": "gamma", "ablation_values": (1.2,)}, "--config.ablation_values"),
    ({"ablation": "alpha", "ablation_values": ("x",)}, "--config.ablation_values"),
    ({"first_order": "yes"}, "--config.first_order"),
  ],
)
def test_bad_config_fields_raise_naming_the_field(tmp_path, changes, field):
  config = tiny()
  for path, value in changes.items():
    _set(config, path, value)
  with pytest.raises(ValueError, match=field.replace(".", r"\.")) as err:
    runner.train_and_evaluate(config, str(tmp_path / "out"), QUIET)
  assert "\n" not in str(err.value)
  assert str(err.value).count(" is invalid for ") <= 1, err.value  # one field named, once
  assert not (tmp_path / "out").exists()  # refused before anything was written


def test_bad_workdir_raises():
  with pytest.raises(ValueError, match="--workdir"):
    runner.train_and_evaluate(tiny(), "", QUIET)
