"""E1 (experiments.dro_fl): offline digits, MNIST under tfds.testing.mock_data, the grid
search, resume, bad config fields."""

import json
import os
import types
import warnings

import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiments import dro_fl
from experiments.configs import dro_fl as dro_fl_config
from experiments.configs import dro_fl_grid
from fedco.experiment import outputs, runner
from tests import helpers

QUIET = runner.Options(progress=False)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
run = runner.train_and_evaluate


def _config(variant=dro_fl_config, **changes):
  config = variant.get_config()
  config.rounds, config.eval_every, config.seeds = 6, 3, (0,)
  return helpers.override(config, changes)


def _keep(config, *labels):
  for label in list(config.methods):
    if label not in labels:
      del config.methods[label]
  return config


def _outputs(workdir):
  for name in ("config.json", "metrics.jsonl", "metrics.csv", "summary.json", "accuracy.png"):
    assert os.path.exists(os.path.join(workdir, name)), name
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  return summary, outputs.read_jsonl(os.path.join(workdir, "metrics.jsonl"))


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
  """Every method at the paper's settings, 7 rounds with evaluation every 3 (round 7 is not
  evaluated)."""
  workdir = tmp_path_factory.mktemp("e1")
  run(_config(rounds=7), str(workdir), QUIET)
  return _outputs(str(workdir))


def test_every_method_reports_under_its_label_everywhere(default_run):
  summary, records = default_run
  labels = set(dro_fl_config.get_config().methods)
  assert set(summary["methods"]) == labels
  assert {row["method"] for row in summary["table"]} == labels
  assert {r["method"] for r in records} == labels - {"comfedl"}  # it diverges at round 1
  assert {r["round"] for r in records} == {1, 3, 6, 7}  # round 1, every 3rd, the last
  for r in records:
    assert 0.0 <= r["val_acc_worst"] <= r["val_acc_avg"] <= 1.0
    assert 0.0 <= r["test_acc_worst"] <= r["test_acc_avg"] <= 1.0
  weights = [r["client_weights"] for r in records if r["method"] == "comfedl_normalized"]
  assert weights and np.allclose(np.sum(weights[-1]), 1.0, atol=1e-5)
  assert summary["methods"]["fedavg"]["val_acc_avg"]["mean"] > 0.3  # six rounds learn digits
  paired = summary["against_fedavg"]
  assert set(paired) == {"comfedl", "comfedl_normalized"}
  assert paired["comfedl"]["val"] == {
    "difference": None,
    "stderr": None,
    "seeds": 0,
    "lost_seeds": 1,
    "at_least_fedavg": False,
  }
  for split, d in paired["comfedl_normalized"].items():  # one seed: no standard error
    per_seed = {m: summary["methods"][m]["per_seed"]["0"] for m in ("comfedl_normalized", "fedavg")}
    want = (
      per_seed["comfedl_normalized"][f"{split}_acc_worst"]
      - per_seed["fedavg"][f"{split}_acc_worst"]
    )
    assert d["seeds"] == 1 and d["stderr"] is None and np.isclose(d["difference"], want)
    assert d["at_least_fedavg"] == (round(want, 6) >= 0)
  diverged, line = dro_fl.paired_lines(paired)  # the printed lines: no std error, one seed
  assert diverged == "comfedl - fedavg: diverged on 1 seed that fedavg finished"
  assert line.startswith("comfedl_normalized - fedavg") and "(1 seed;" in line
  assert f"test {paired['comfedl_normalized']['test']['difference']:+.3f}," not in line
  assert line.endswith(f"test {paired['comfedl_normalized']['test']['difference']:+.3f}")


def test_against_fedavg_pairs_seeds_both_finished_and_finds_methods_by_algorithm():
  row = lambda v, t: {"train_acc_worst": t, "val_acc_worst": v, "test_acc_worst": v}
  per_method = {
    "dro": {"per_seed": {0: row(0.95, 0.9), 1: row(0.7, 0.9), 2: {"diverged": "..."}}},
    "base": {"per_seed": {0: row(0.95, 0.8), 1: {"diverged": "..."}, 2: row(0.5, 0.8)}},
    "other": {"per_seed": {0: row(0.1, 0.1)}},
  }
  # seed 0 only (1 and 2 diverged in one of the two); 0.95 from float32 sums of different
  # lengths may differ in the last bits: they compare equal
  per_method["dro"]["per_seed"][0]["val_acc_worst"] = 0.95 - 3e-8
  paired = dro_fl.against_fedavg(per_method, ["dro"], "base")
  assert set(paired) == {"dro"}
  # seed 2, which FedAvg finished and the DRO run did not, is a loss the mean does not see
  assert paired["dro"]["val"] == {
    "difference": 0.0,
    "stderr": None,
    "seeds": 1,
    "lost_seeds": 1,
    "at_least_fedavg": False,
  }
  assert np.isclose(paired["dro"]["train"]["difference"], 0.1)
  assert dro_fl.paired_lines(paired) == [
    "dro - fedavg, worst-client accuracy paired by seed (1 seed; +- standard error): "
    "train +0.100, val +0.000, test +0.000; diverged on 1 seed that fedavg finished"
  ]
  per_method["base"]["per_seed"][2] = {"diverged": "..."}  # both diverged on seed 2
  assert dro_fl.against_fedavg(per_method, ["dro"], "base")["dro"]["val"] == {
    "difference": 0.0,
    "stderr": None,
    "seeds": 1,
    "lost_seeds": 0,
    "at_least_fedavg": True,
  }
  assert dro_fl.against_fedavg(per_method, ["dro"], None) == {}


def test_rounds_past_the_last_evaluation_keep_finite_finals(default_run):
  """7 rounds with evaluation every 3: the last round is evaluated too, so the finals are
  round 7's, finite, and nothing but the literal ComFedL is reported as diverged."""
  summary, _ = default_run
  for label, entry in summary["methods"].items():
    if label == "comfedl":
      continue
    assert entry["diverged_seeds"] == [] and np.isfinite(entry["val_acc_worst"]["mean"])
    assert entry["per_seed"]["0"]["round"] == 7


def test_the_literal_comfedl_divergence_is_reported_in_the_table(default_run):
  summary, records = default_run
  entry = summary["methods"]["comfedl"]
  assert entry["diverged_seeds"] == [0]
  per_seed = entry["per_seed"]["0"]
  assert per_seed["diverged"] == (
    f"diverged at round {per_seed['diverged_round']} ({per_seed['diverged_quantity']}); "
    "try a lower --config.methods.comfedl.learning_rate"
  )
  assert per_seed["diverged_quantity"] != "client_weights"  # a scalar metric is named
  row = next(r for r in summary["table"] if r["method"] == "comfedl")
  assert row["note"] == per_seed["diverged"] and row["val_acc_worst"] is None
  fedavg = next(r for r in summary["table"] if r["method"] == "fedavg")
  assert "+-" not in fedavg["val_acc_worst"]  # one seed: no std


def test_grid_search_picks_on_validation_and_reports_test(tmp_path):
  config = _keep(
    _config(dro_fl_grid, rounds=4, eval_every=2, seeds=(0, 1)), "comfedl_normalized", "qfedavg"
  )
  config.grid.learning_rate = (0.01, 0.1)
  config.grid.gamma = (0.5, 5.0)
  config.grid.qfedavg.q = (0.2, 1.0)
  summary = run(config, str(tmp_path), QUIET)
  grid = summary["grid"]
  assert grid["select_seeds"] == [100, 101]
  for points in grid["points"].values():  # a point's score: the mean over the two seeds
    for p in points:
      if p["score"] is not None:
        np.testing.assert_allclose(p["score"], np.mean(p["per_seed"], axis=0), rtol=1e-6)
  assert len(grid["points"]["comfedl_normalized"]) == 4 and len(grid["points"]["qfedavg"]) == 4
  for label, points in grid["points"].items():
    best = max((p for p in points if p["score"] is not None), key=lambda p: p["score"])
    assert grid["chosen"][label] == best
    chosen = summary["settings"][label]
    assert chosen["learning_rate"] == best["learning_rate"]
  assert summary["settings"]["qfedavg"]["q"] == grid["chosen"]["qfedavg"]["q"]
  assert (
    summary["settings"]["comfedl_normalized"]["gamma"]
    == (grid["chosen"]["comfedl_normalized"]["gamma"])
  )
  entry = summary["methods"]["qfedavg"]
  assert sorted(entry["per_seed"]) == [0, 1] and entry["test_acc_worst"]["std"] is not None
  row = next(r for r in summary["table"] if r["method"] == "qfedavg")
  assert "+-" in row["test_acc_worst"]  # two seeds: mean +- std


def test_grid_search_scores_are_those_of_a_separate_run(tmp_path):
  """The sweep's score of a grid point equals a plain run of that point on the selection
  seed (the vmapped grid is the same computation)."""
  config = _keep(
    _config(dro_fl_grid, rounds=4, eval_every=2, seeds=(100,), select_seeds=(100,)), "fedavg"
  )
  config.grid.learning_rate = (0.05, 0.2)
  summary = run(config, str(tmp_path), QUIET)
  best = summary["grid"]["chosen"]["fedavg"]
  final = summary["methods"]["fedavg"]["per_seed"][100]
  np.testing.assert_allclose(
    best["score"], [final["val_acc_worst"], final["val_acc_avg"]], atol=1e-6
  )


def _client_labels(data):
  rows, offsets, counts = (np.asarray(a) for a in (data.flat_rows, data.offsets, data.counts))
  labels = np.asarray(data.examples["y"])
  return [labels[rows[o : o + c]] for o, c in zip(offsets, counts)], rows, offsets, counts


def test_digits_heldout_sets_hold_min_heldout_images_with_the_client_class_mix():
  config = _config()
  splits = dro_fl.load(config)
  for floor, small in ((0, 100), (10, 10)):  # 0: digits' 100; 10: the size ratio's 10
    config.min_heldout = floor
    with warnings.catch_warnings():
      warnings.simplefilter("error", RuntimeWarning)  # no class runs out: each draws its own
      dro_fl.check(config)
      fed, test_clients = dro_fl.build_data((splits.train, splits.test), config, 0)
    train_labels, *_ = _client_labels(fed.train)
    for held_out in (fed.val, test_clients):
      labels, rows, offsets, counts = _client_labels(held_out)
      sizes = sorted(counts.tolist())  # the big client's: half its 500 (the size ratio)
      assert sizes[:9] == [small] * 9 and 249 <= sizes[9] <= 251
      for k, (lt, lh) in enumerate(zip(train_labels, labels)):
        assert np.unique(rows[offsets[k] : offsets[k] + counts[k]]).size == counts[k]
        want = np.bincount(lt, minlength=10) / lt.size * lh.size
        assert np.all(np.abs(np.bincount(lh, minlength=10) - want) < 1.0)
    val_rows = set(np.asarray(fed.val.flat_rows).tolist())
    assert not val_rows & set(np.asarray(test_clients.flat_rows).tolist())  # two halves


def test_mnist_end_to_end_under_mock_data(tmp_path):
  config = _keep(_config(dataset="mnist", big=100, small=5), "comfedl_normalized", "fedavg")
  with tfds.testing.mock_data(num_examples=400):
    summary = run(config, str(tmp_path), QUIET)
  assert summary["dataset"] == "mnist"
  assert all(e["diverged_seeds"] == [] for e in summary["methods"].values())


def test_npz_dataset_runs_like_the_named_one_and_its_content_is_hashed(tmp_path):
  """--config.dataset=<file>.npz: digits saved as an archive give the digits run's numbers;
  new content at the same path starts new
  runs instead of resuming the old ones; the model has as many outputs as the labels need."""
  train, test = dro_fl.load(_config())
  path = tmp_path / "digits.npz"
  np.savez(path, x_train=train["x"], y_train=train["y"], x_test=test["x"], y_test=test["y"])
  config = _keep(_config(rounds=3, eval_every=3, big=500, min_heldout=100), "fedavg")
  options = runner.Options(progress=False, checkpoint_every=3)
  named = run(config, str(tmp_path / "named"), QUIET)
  config.dataset = str(path)
  from_npz = run(config, str(tmp_path / "npz"), options)
  assert from_npz["data_sha256"] == outputs.file_digest(path)
  assert from_npz["table"] == named["table"]
  # new content at the same path, with labels 5..14: 15 classes, not E1's usual 10
  np.savez(path, x_train=train["x"], y_train=train["y"] + 5, x_test=test["x"], y_test=test["y"] + 5)
  changed = run(config, str(tmp_path / "npz"), options)
  assert len(os.listdir(tmp_path / "npz" / "checkpoints")) == 2  # not resumed
  assert changed["methods"]["fedavg"]["diverged_seeds"] == []
  assert changed["table"] != from_npz["table"]
  with pytest.raises(FileNotFoundError, match="--config.dataset: no such .npz file"):
    runner.check(_config(dataset=str(tmp_path / "none.npz")))
  with pytest.raises(ValueError, match="--config.big .* at most the 899 training images"):
    run(_config(dataset=str(path)), str(tmp_path / "big"), QUIET)  # MNIST's 5000
  assert not os.path.exists(tmp_path / "big")


def test_comfedl_data_size_prior_from_the_config(tmp_path):
  """--config.methods.comfedl_normalized.weighting=samples: the KL ball around the data
  mixture; the reported implied weights carry that prior (the big client's 500 of 680
  training images outweigh nine 20-image clients)."""
  config = _keep(_config(rounds=3, eval_every=3), "comfedl_normalized")
  config.methods.comfedl_normalized.weighting = "samples"
  summary = run(config, str(tmp_path), QUIET)
  assert summary["settings"]["comfedl_normalized"]["weighting"] == "samples"
  weights = np.array(
    [r["client_weights"] for r in outputs.read_jsonl(tmp_path / "metrics.jsonl")][-1]
  )
  assert np.isclose(weights.sum(), 1.0, atol=1e-5) and weights.max() > 0.5


def test_gamma_ablation_runs_comfedl_variants(tmp_path):
  config = _config(ablation="gamma", ablation_values=(2.0, 5.0), rounds=3, eval_every=3)
  summary = run(config, str(tmp_path), QUIET)
  assert set(summary["methods"]) == {"comfedl_normalized_gamma=2", "comfedl_normalized_gamma=5"}
  assert summary["settings"]["comfedl_normalized_gamma=5"]["gamma"] == 5.0


@pytest.mark.parametrize(
  "changes,field",
  [
    (dict(dataset="cifar7"), "--config.dataset"),
    (dict(mode="search"), "--config.mode"),
    ({"methods.fedavg.algorithm": "sgd"}, "--config.methods.fedavg.algorithm"),
    ({"methods.qfedavg.p": 1.0}, "--config.methods.qfedavg.p is not an argument"),
    (dict(rounds=0), "--config.rounds"),
    (dict(learning_rate=-0.1), "--config.learning_rate"),
    ({"methods.drfa.local_steps": 1}, "--config.methods.drfa.local_steps"),
    (dict(seeds=("a",)), "--config.seeds"),
    (dict(ablation="lr"), "--config.ablation"),
    (dict(mode="grid", select_seeds=()), "--config.select_seeds"),
    (dict(mode="grid", ablation="gamma"), "--config.ablation runs"),
    (dict(ablation="local_steps", ablation_values=(0,)), "--config.ablation_values"),
  ],
)
def test_bad_fields_are_named(changes, field):
  config = helpers.override(_config(), changes)
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    runner.check(config)


def test_missing_tfds_dataset_is_a_clear_error(tmp_path):
  config = _config(dataset="mnist", data_dir=str(tmp_path / "empty"))
  with pytest.raises(FileNotFoundError, match="mnist"):
    run(config, str(tmp_path / "out"), QUIET)


def test_rerun_resumes_from_checkpoints_and_plot_regenerates(tmp_path, capsys):
  from fedco.experiment import plot

  config = _keep(_config(), "fedavg", "drfa")
  options = runner.Options(progress=False, checkpoint_every=3)
  first = run(config, str(tmp_path), options)
  runs = os.listdir(tmp_path / "checkpoints")
  assert len(runs) == 2 and all(os.listdir(tmp_path / "checkpoints" / r) for r in runs)
  capsys.readouterr()
  second = run(config, str(tmp_path), options)  # restores the finished runs
  assert first["table"] == second["table"]
  strip = lambda s: {
    m: {k: v for k, v in e["per_seed"][0].items() if k != "seconds"}
    for m, e in s["methods"].items()
  }
  assert strip(first) == strip(second)
  assert capsys.readouterr().err.count("resumed from round 6") == 2  # both runs resumed
  rows = outputs.read_jsonl(tmp_path / "metrics.jsonl")
  assert sorted((r["method"], r["round"]) for r in rows) == [
    (m, r) for m in ("drfa", "fedavg") for r in (1, 3, 6)
  ]  # written once each
  config.learning_rate = 0.02
  changed = run(config, str(tmp_path), options)  # a new hash: new runs
  assert len(os.listdir(tmp_path / "checkpoints")) == 4
  assert strip(changed)["fedavg"] != strip(first)["fedavg"]
  with open(tmp_path / "metrics.csv") as f:
    header = f.readline().strip().split(",")
  assert {"round", "method", "seed", "val_acc_worst"} <= set(header)
  out = plot.plot(str(tmp_path), ["val_acc_worst"], out="again.png")
  assert os.path.getsize(out) > 0
  with pytest.raises(ValueError, match="--metrics"):
    plot.plot(str(tmp_path), ["nope"])


def test_the_figure_names_a_method_that_diverged_before_any_curve():
  saved = {}
  wd = types.SimpleNamespace(save_figure=lambda fig, name: saved.update(fig=fig, name=name))
  records = [
    {"method": "fedavg", "seed": 0, "round": r, "val_acc_avg": 0.5, "val_acc_worst": 0.4}
    for r in (1, 2)
  ]
  finals = {"comfedl": {0: {"diverged": "...", "diverged_round": 1}}, "fedavg": {0: {}}}
  methods = [runner.Method(label, label, {}, 0.01, 5) for label in ("comfedl", "fedavg")]
  dro_fl.plot(wd, _config(), runner.Outcome(methods, (0,), finals, records))
  assert saved["name"] == "accuracy.png"
  texts = saved["fig"].axes[0].get_legend_handles_labels()[1]
  assert texts == ["fedavg", "comfedl (diverged at round 1)"]
  for ax in saved["fig"].axes:
    assert ax.get_xlabel() == "round" and ax.get_ylabel().startswith("validation")


def test_a_method_gets_the_dro_problem_of_its_kind(tmp_path):
  # ComFedL (local-inner): the exp form; FedDRO (global-inner): the log form, on the clients'
  # ids; FedAvg: the plain loss. So a registered method of either kind runs in E1.
  config = _config()
  forms = {}
  for label, algorithm in (("comfedl", "comfedl"), ("feddro", "feddro"), ("fedavg", "fedavg")):
    method = runner.Method(label, algorithm, {}, 0.01, 5, problem={"gamma": 0.2})
    form = dro_fl.kind(method, 0.2)
    problem = dro_fl.make_problem(form, lambda p, e: 0.0, 0.2, config.num_clients)
    forms[label] = problem.kind if problem.compositional else "plain"
  assert forms == {"comfedl": "local", "feddro": "global", "fedavg": "plain"}
  config.methods = runner.method_entries(
    {"fedavg": {"algorithm": "fedavg"}, "feddro": {"algorithm": "feddro"}}
  )
  summary = runner.train_and_evaluate(config, str(tmp_path), runner.Options(progress=False))
  assert [row["method"] for row in summary["table"]] == ["fedavg", "feddro"]
  assert all("note" not in row and row["val_acc_worst"] for row in summary["table"]), summary
