"""Experiment binaries: the shared output contract and E7 (the FedAvg counterexample)."""

import json
import os
import sys

import numpy as np
import pytest

import fedco
from experiments.configs.fedavg_counterexample import get_config
from fedco.experiment import outputs, runner
from tests import helpers

OUTPUTS = ("config.json", "metrics.jsonl", "metrics.csv", "summary.json", "distance.png")
METHODS = ("fedavg_co_case1", "fedavg_co_case2", "fedavg_co_modified", "feddro")
E7_CONFIG = "--config=experiments/configs/fedavg_counterexample.py"
QUIET = runner.Options(progress=False)


@pytest.fixture(scope="module")
def e7_default(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("e7")
  summary = runner.train_and_evaluate(get_config(), str(workdir), QUIET)
  return workdir, summary


def test_e7_writes_all_outputs(e7_default):
  workdir, summary = e7_default
  for name in OUTPUTS:
    assert (workdir / name).is_file(), name
  assert not [n for n in os.listdir(workdir) if n.startswith(".tmp-")]
  config = json.loads((workdir / "config.json").read_text())
  assert config["learning_rate"] == 0.02 and config["local_steps"] == 5
  assert config["rounds"] == 400 and tuple(config["methods"]) == METHODS
  assert config["methods"]["fedavg_co_case1"] == {  # None: the shared value applies
    "algorithm": "fedavg_co",
    "case": "I",
    "learning_rate": None,
    "local_steps": None,
  }
  assert json.loads((workdir / "summary.json").read_text()) == outputs.to_jsonable(summary)
  records = outputs.read_jsonl(workdir / "metrics.jsonl")
  assert len(records) == 400 * len(METHODS)
  assert {"round", "method", "seed", "x", "distance", "grad_norm"} <= set(records[0])
  assert [(r["method"], r["round"]) for r in records[:2]] == [
    ("fedavg_co_case1", 1),
    ("fedavg_co_case1", 2),
  ]
  assert [row["method"] for row in summary["table"]] == list(METHODS)
  assert summary["steps"] == {m: 2000 for m in METHODS}
  assert (workdir / "distance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_e7_feddro_and_modified_converge_cases_i_ii_do_not(e7_default):
  _, summary = e7_default
  d = summary["final_distance"]
  assert summary["x_star"] == 1.0
  assert d["feddro"] < 1e-3 and d["fedavg_co_modified"] < 1e-3
  assert d["fedavg_co_case1"] > 0.05 and d["fedavg_co_case2"] > 0.05
  assert summary["converged"] == {
    "fedavg_co_case1": False,
    "fedavg_co_case2": False,
    "fedavg_co_modified": True,
    "feddro": True,
  }
  # |Phi'(x)| = 4 |x - 1| on this instance: the recorded gradient norm agrees.
  for name, dist in d.items():
    np.testing.assert_allclose(summary["final_grad_norm"][name], 4 * dist, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize(
  "path, value, field",
  [
    ("learning_rate", 0.0, "--config.learning_rate"),
    ("local_steps", 0, "--config.local_steps"),
    ("rounds", 0, "--config.rounds"),
    ("eval_every", 0, "--config.eval_every"),
    ("batch_size", 4, "--config.batch_size"),
    ("x0", float("nan"), "--config.x0"),
    ("methods.feddro.beta", 1.5, "--config.methods.feddro"),
    ("methods.fedavg_co_case1.case", "III", "--config.methods.fedavg_co_case1"),
    ("methods.feddro.case", "I", "--config.methods.feddro.case"),
  ],
)
def test_e7_bad_config_raises_before_writing(tmp_path, path, value, field):
  config = get_config()
  *parents, name = path.split(".")
  parent = config
  for p in parents:
    parent = parent[p]
  setattr(parent, name, value)
  workdir = tmp_path / "out"
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    runner.train_and_evaluate(config, str(workdir), QUIET)
  assert not workdir.exists()


def test_e7_unknown_algorithm_lists_allowed_values(tmp_path):
  config = get_config()
  config.methods.feddro.algorithm = "fedsplit"  # not (yet) a fedco algorithm
  with pytest.raises(ValueError, match=r"--config\.methods\.feddro\.algorithm") as info:
    runner.train_and_evaluate(config, str(tmp_path), QUIET)
  assert "fedavg_co" in str(info.value) and "scaffold" in str(info.value)


@pytest.mark.parametrize("workdir", ["", "   ", None, 3])
def test_workdir_must_be_a_path(workdir):
  with pytest.raises(ValueError, match="--workdir"):
    outputs.Workdir(workdir)


def _append_metrics(wd, rows):
  """The rows written as the runner's streamed writers write them."""
  for writer in (fedco.runtime.JsonlWriter, fedco.runtime.CsvWriter):
    writer(
      wd.record(
        wd.file(outputs.METRICS if writer is fedco.runtime.JsonlWriter else outputs.METRICS_CSV)
      )
    ).write(rows)


def test_workdir_contract(tmp_path):
  wd = outputs.Workdir(tmp_path / "run")
  wd.write_config({"lr": np.float32(0.5), "steps": np.int64(3), "on": np.bool_(True)})
  _append_metrics(wd, [{"round": 1, "x": 0.5}])
  wd.write_summary({"best": np.array(2.0), "nan": float("nan")})
  assert json.loads((tmp_path / "run" / "config.json").read_text()) == {
    "lr": 0.5,
    "steps": 3,
    "on": True,
  }
  assert outputs.read_jsonl(tmp_path / "run" / "metrics.jsonl") == [{"round": 1, "x": 0.5}]
  summary = {"best": 2.0, "nan": None}  # strict JSON: non-finite numbers are null
  assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
  with pytest.raises(TypeError, match="object"):
    wd.write_summary({"bad": object()})
  assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
  assert sorted(os.listdir(tmp_path / "run")) == [
    ".fedco-written.json",
    ".lock",
    "config.json",
    "metrics.csv",
    "metrics.jsonl",
    "summary.json",
  ]
  assert (tmp_path / "run" / "metrics.csv").read_text().splitlines() == ["round,x", "1,0.5"]
  table = outputs.format_table([{"a": "x", "b": 0.123456}, {"a": "yy", "b": None}])
  assert table.splitlines()[2].split() == ["x", "0.1235"]


def test_a_workdir_removes_only_what_it_wrote(tmp_path):
  """A rerun replaces the previous run's outputs (manifest-listed) and nothing else: not a
  user's tensorboard tree, .tmp-* file or checkpoints directory; --noresume removes only the
  run checkpoint directories the workdir created."""
  run = tmp_path / "run"
  wd = outputs.Workdir(run)
  wd.write_config({"a": 1})
  _append_metrics(wd, [{"round": 1, "x": 0.5}])
  ours = wd.record(outputs.run_checkpoint_dir(wd.path, "fedavg", {"seed": 0}))
  os.makedirs(ours)
  wd.write_summary({"done": True})
  for name in ("user/tensorboard/events.keep", "checkpoints/mine/keep", ".tmp-mine"):
    (run / name).parent.mkdir(parents=True, exist_ok=True)
    (run / name).write_text("user data")
  del wd
  wd = outputs.Workdir(run)
  assert os.path.isdir(ours)  # checkpoints stay for resuming ...
  outputs.start_checkpoints(wd, {"resume": False})  # ... unless --noresume, as a run starts
  assert not os.path.exists(ours)
  wd.write_config({"a": 2})
  wd.record(wd.file(outputs.METRICS))  # announced (a writer was opened) but never written
  wd.write_summary({"done": True})  # so the previous metrics go all the same
  assert json.loads((run / "config.json").read_text()) == {"a": 2}
  assert not (run / "metrics.jsonl").exists() and not (run / "in_progress").exists()
  assert "metrics.jsonl" not in outputs.read_manifest(str(run))
  for name in ("user/tensorboard/events.keep", "checkpoints/mine/keep", ".tmp-mine"):
    assert (run / name).read_text() == "user data", name


def test_a_rerun_replaces_the_results_only_once_it_completes(tmp_path):
  """A rerun that stops before its summary (killed, or an error) leaves the previous complete
  results in place, its own partial outputs in in_progress/; the next complete run replaces
  both."""
  run = tmp_path / "run"
  first = outputs.Workdir(run)
  first.write_config({"run": 1})
  _append_metrics(first, [{"round": 1, "x": 1.0}])
  first.save_figure(outputs.figure(), "plot.png")
  first.write_summary({"run": 1})
  del first
  second = outputs.Workdir(run)  # starts, streams, then dies before its summary
  second.write_config({"run": 2})
  _append_metrics(second, [{"round": 1, "x": 2.0}])
  assert json.loads((run / "config.json").read_text()) == {"run": 1}
  assert outputs.read_jsonl(run / "metrics.jsonl") == [{"round": 1, "x": 1.0}]
  assert json.loads((run / "summary.json").read_text()) == {"run": 1}
  assert (run / "plot.png").exists()
  assert outputs.read_jsonl(run / "in_progress" / "metrics.jsonl") == [{"round": 1, "x": 2.0}]
  del second
  third = outputs.Workdir(run)
  assert not (run / "in_progress" / "metrics.jsonl").exists()  # the partial outputs went
  third.write_config({"run": 3})
  _append_metrics(third, [{"round": 1, "x": 3.0}])
  third.write_summary({"run": 3})
  assert json.loads((run / "summary.json").read_text()) == {"run": 3}
  assert outputs.read_jsonl(run / "metrics.jsonl") == [{"round": 1, "x": 3.0}]
  assert not (run / "plot.png").exists()  # the previous run's figure: not rewritten, gone
  assert sorted(outputs.read_manifest(str(run))) == [
    "config.json",
    "metrics.csv",
    "metrics.jsonl",
    "summary.json",
  ]


def test_a_folder_named_in_progress_that_fedco_did_not_write_is_left_alone(tmp_path):
  (tmp_path / "in_progress").mkdir()
  (tmp_path / "in_progress" / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="in_progress/, which fedco did not write"):
    outputs.Workdir(tmp_path)
  assert (tmp_path / "in_progress" / "notes.txt").read_text() == "mine"


def test_an_unwritable_workdir_is_a_one_line_error(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(ValueError, match="--workdir") as err:
    outputs.Workdir(tmp_path / "file" / "run")
  assert "\n" not in str(err.value)


def test_e7_binary_runs(tmp_path):
  workdir = tmp_path / "e7"
  flagfile = tmp_path / "flags"
  flagfile.write_text("--config.methods.feddro.local_steps=3\n")
  proc = helpers.run(
    [
      sys.executable,
      "-m",
      "experiments.main",
      E7_CONFIG,
      f"--workdir={workdir}",
      "--config.rounds=50",
      "--config.eval_every=7",
      f"--flagfile={flagfile}",
      "--config.methods.fedavg_co_case1.learning_rate",
      "0.01",
    ],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  summary = json.loads((workdir / "summary.json").read_text())
  # a method's own local_steps (from a flag file) and learning_rate (its value after a
  # space), which the config file leaves shared
  assert summary["rounds"] == 50 and summary["steps"]["feddro"] == 150
  assert summary["steps"]["fedavg_co_case2"] == 250
  assert summary["settings"]["fedavg_co_case1"]["learning_rate"] == 0.01
  assert summary["settings"]["fedavg_co_case2"]["learning_rate"] == 0.02
  # the command that made it, as a user retypes it (merge_workdirs collects these)
  assert summary["command"] == (
    f"python -m experiments.main {E7_CONFIG} --workdir={workdir} --config.rounds=50 "
    f"--config.eval_every=7 --flagfile={flagfile} "
    "--config.methods.fedavg_co_case1.learning_rate 0.01"
  )
  assert "feddro" in proc.stdout  # the final table
  # evaluated every 7 rounds and at the last, 50, whose values are the finals
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert sorted({r["round"] for r in rows}) == [1, 7, 14, 21, 28, 35, 42, 49, 50]
  for label, entry in summary["methods"].items():
    final = entry["per_seed"]["0"]
    last = [r for r in rows if r["method"] == label and r["round"] == 50]
    assert final["round"] == 50 and np.isfinite(final["distance"]), label
    assert final["distance"] == pytest.approx(last[0]["distance"]), label


def test_e7_binary_bad_flag_exits_cleanly(tmp_path):
  proc = helpers.run(
    [
      sys.executable,
      "-m",
      "experiments.main",
      E7_CONFIG,
      f"--workdir={tmp_path}",
      "--config.methods.feddro.beta=2",
    ],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1].startswith("error: --config.methods.feddro")
  assert "Traceback" not in proc.stderr


def test_with_seeds_one_by_one_they_share_one_compiled_program(tmp_path):
  """E1's held-out sets are ``metrics_data``, so its seeds' rounds are one program: run one
  by one (``--noseeds_together``) with the driver's compilation cache, the second seed loads
  it; the results equal a run without the cache."""

  def driver(workdir, *flags):
    return helpers.run(
      [
        sys.executable,
        "-m",
        "experiments.main",
        "--config=experiments/configs/dro_fl.py",
        f"--workdir={workdir}",
        "--config.rounds=4",
        "--config.seeds=0,1",
        "--methods=comfedl_normalized",
        "--noprogress",
        "--noseeds_together",
        *flags,
      ],
      cwd=helpers.ROOT,
      env={**os.environ, "JAX_LOG_COMPILES": "1"},
      capture_output=True,
      text=True,
      timeout=300,
    )

  cached = driver(tmp_path / "cached", f"--compilation_cache={tmp_path / 'cache'}")
  assert cached.returncode == 0, cached.stderr[-2000:]
  assert cached.stderr.count("Persistent compilation cache hit for 'jit__run_rounds'") == 1
  assert any(p.name.startswith("jit__run_rounds") for p in (tmp_path / "cache").iterdir())
  plain = driver(tmp_path / "plain", "--compilation_cache=")
  assert plain.returncode == 0 and "cache hit" not in plain.stderr
  table = lambda name: json.loads((tmp_path / name / "summary.json").read_text())["table"]
  assert table("cached") == table("plain")


def _e1(workdir, together, **changes):
  from experiments.configs import dro_fl  # pylint: disable=g-import-not-at-top

  config = dro_fl.get_config()
  config.rounds, config.seeds, config.eval_every = 6, (0, 1, 2), 2
  keep = ("fedavg", "comfedl")
  config.methods = {k: v for k, v in config.methods.items() if k in keep}
  config.methods.comfedl.learning_rate = 50.0  # diverges on every seed
  for key, value in changes.items():
    setattr(config, key, value)
  options = runner.Options(progress=False, seeds_together=together, checkpoint_every=4)
  return runner.train_and_evaluate(config, str(workdir), options)


def test_a_methods_seeds_run_as_one_program_equal_to_runs_one_by_one(tmp_path, monkeypatch):
  """E1's seeds (each its own partition and initial model) as one ``fedco.sweep`` per
  method: one checkpoint folder per method, every seed's rows, the same table and finals up
  to float32 round-off, and a diverging method's notes as ``fedco.simulate`` gives them
  (it is rerun alone); a rerun resumes every run from the checkpoints."""
  calls, chunks = {"sweep": 0, "simulate": 0}, set()
  for name in calls:
    original = getattr(fedco, name)

    def counted(*args, _name=name, _original=original, **kwargs):
      calls[_name] += 1
      chunks.add(kwargs.get("chunk_rounds"))
      return _original(*args, **kwargs)

    monkeypatch.setattr(fedco, name, counted)
  together = _e1(tmp_path / "together", True)
  assert calls == {"sweep": 2, "simulate": 3}  # comfedl's three seeds rerun alone
  assert chunks == {2}  # progress_chunk(6, eval_every 2, checkpoint_every 4): the bar moves
  apart = _e1(tmp_path / "apart", False)
  assert together["table"] == apart["table"]
  assert together["methods"]["comfedl"] == apart["methods"]["comfedl"]  # divergence notes
  for seed in (0, 1, 2):
    mine, theirs = (s["methods"]["fedavg"]["per_seed"][seed] for s in (together, apart))
    for key in ("val_acc_worst", "test_loss_avg", "train_loss_worst"):
      np.testing.assert_allclose(mine[key], theirs[key], rtol=2e-6)
  folders = sorted(os.listdir(tmp_path / "together" / outputs.CHECKPOINTS))
  assert [f.rsplit("-", 1)[0] for f in folders] == [
    "comfedl-seed0",
    "comfedl-seed1",
    "comfedl-seed2",
    "comfedl-seeds0-1-2",
    "fedavg-seeds0-1-2",
  ]
  rows = outputs.read_jsonl(tmp_path / "together" / outputs.METRICS)
  assert sorted({(r["method"], r["seed"]) for r in rows if r["method"] == "fedavg"}) == [
    ("fedavg", 0),
    ("fedavg", 1),
    ("fedavg", 2),
  ]
  assert [r["round"] for r in rows if (r["method"], r["seed"]) == ("fedavg", 1)] == [1, 2, 4, 6]
  calls.update(sweep=0, simulate=0)
  again = _e1(tmp_path / "together", True)  # resumed: nothing runs again
  assert again["table"] == together["table"]
  order = lambda rs: sorted(rs, key=lambda r: (r["method"], r["seed"], r["round"]))
  assert order(outputs.read_jsonl(tmp_path / "together" / outputs.METRICS)) == order(rows)


@pytest.mark.parametrize("name", ["losses", "plot.pdf", "sub/plot.png", None])
def test_a_figure_name_must_be_a_png_file_name(tmp_path, name):
  wd = outputs.Workdir(tmp_path / "run")
  with pytest.raises(ValueError, match="a figure's name must be a file name ending in .png"):
    wd.save_figure(outputs.figure(), name)
  assert not os.listdir(wd.file("."))  # nothing written


def test_a_rerun_with_another_config_names_the_fields_that_changed(tmp_path):
  first = outputs.Workdir(tmp_path / "run")
  first.write_config({"rounds": 10, "methods": {"fedavg": {"learning_rate": 0.1}}})
  first.write_summary({})
  del first
  wd = outputs.Workdir(tmp_path / "run")
  same = {"rounds": 10, "methods": {"fedavg": {"learning_rate": 0.1}}}
  assert outputs.changed_config(wd, same) == []
  other = {"rounds": 10, "seeds": [0], "methods": {"fedavg": {"learning_rate": 5.0}}}
  assert outputs.changed_config(wd, other) == ["methods.fedavg.learning_rate", "seeds"]
  more = {"rounds": 10, "methods": {"fedavg": {"learning_rate": 0.1}, "sgd": {"a": 1, "b": 2}}}
  assert outputs.changed_config(wd, more) == ["methods.sgd"]  # a method only one run has
  assert outputs.changed_config(outputs.Workdir(tmp_path / "fresh"), other) == []


def test_a_factory_error_names_the_config_field_only_when_the_config_gave_it():
  given = runner.Method("q", "qfedavg", {"q": -1.0}, 0.1, 5)
  with pytest.raises(ValueError, match=r"^--config\.methods\.q\.q is invalid for fedco\.qfedavg"):
    given.build()
  computed = runner.Method("c", "comfedl", {"normalized": True}, 0.1, 5)  # gamma: the module's
  with pytest.raises(
    ValueError, match=r"^--config\.methods\.c is invalid for fedco\.comfedl: gamma"
  ):
    computed.build(gamma=-1.0)
  with pytest.raises(ValueError, match=r"^--config\.ablation_values is invalid for fedco\.comfedl"):
    computed.build(config_field="--config.ablation_values", gamma=-1.0)


def test_a_figure_leaves_out_the_runs_that_diverged_and_names_them(recwarn):
  rows = [  # seed 1 of sgd diverged at round 3: its last rows explode
    {"method": m, "seed": s, "round": r, "loss": 1e30**r if (m, s) == ("sgd", 1) else 1.0 / r}
    for m in ("fedavg", "sgd")
    for s in (0, 1)
    for r in (1, 2)
  ]
  finals = {
    "fedavg": {0: {"loss": 0.5}, 1: {"loss": 0.5}},
    "sgd": {0: {"loss": 0.5}, 1: {"diverged": "...", "diverged_round": 3}},
  }
  fig = outputs.curves(rows, ["fedavg", "sgd"], [("loss", "loss")], finals=finals)
  ax = fig.axes[0]
  assert ax.get_legend_handles_labels()[1] == [
    "fedavg",
    "sgd (diverged at round 3 on 1 of 2 seeds)",
  ]
  assert ax.get_ylim()[1] < 10  # set by the runs that finished
  assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
  every = {"fedavg": finals["fedavg"], "sgd": {s: finals["sgd"][1] for s in (0, 1)}}
  fig = outputs.curves(rows, ["fedavg", "sgd"], [("loss", "loss")], finals=every)
  assert fig.axes[0].get_legend_handles_labels()[1] == ["fedavg", "sgd (diverged at round 3)"]


def test_the_plot_command_leaves_out_what_the_summary_says_diverged(tmp_path, monkeypatch):
  from fedco.experiment import plot

  wd = outputs.Workdir(tmp_path)
  with open(wd.record(wd.file(outputs.METRICS)), "w") as f:
    for r in (1, 2):
      f.write(json.dumps({"method": "sgd", "seed": 0, "round": r, "loss": 1e30**r}) + "\n")
      f.write(json.dumps({"method": "sgd", "seed": 1, "round": r, "loss": 1.0}) + "\n")
  per_seed = {"0": {"diverged": "...", "diverged_round": 3}, "1": {"loss": 1.0}}  # str keys
  wd.write_summary({"methods": {"sgd": {"per_seed": per_seed}}})
  saved = {}
  monkeypatch.setattr(outputs.Workdir, "save_figure_to", lambda d, fig, out: saved.update(fig=fig))
  plot.plot(str(tmp_path), ["loss"], log_y=True)
  (line,) = saved["fig"].axes[0].get_lines()
  assert list(line.get_ydata()) == [1.0, 1.0]  # seed 1's rows only
  assert saved["fig"].axes[0].get_yscale() == "log"


def test_curves_refuse_a_bad_panel_and_say_when_a_log_panel_has_nothing_to_draw():
  rows = [{"method": "a", "seed": 0, "round": r, "gap": 0.0} for r in (1, 2)]
  with pytest.raises(ValueError, match="panels: each is"):
    outputs.curves(rows, ["a"], [("gap", "gap", "symlog")])
  fig = outputs.curves(rows, ["a"], [("gap", "gap", "log")])
  assert "no positive value for a log axis" in fig.axes[0].texts[0].get_text()


def test_curves_wrap_a_long_title_to_the_panel_s_width():
  rows = [{"method": "a", "seed": 0, "round": r, "x": float(r), "y": 1.0} for r in (1, 2)]
  title = "Omniglot 20-way 1-shot, after adaptation"
  fig = outputs.curves(
    rows, ["a"], [("x", "query cross-entropy on training tasks"), ("y", "y")], title=title
  )
  long, short = (ax.get_title() for ax in fig.axes)
  assert long.replace("\n", " ") == f"{title}: query cross-entropy on training tasks"
  assert "\n" in long and max(len(line) for line in long.splitlines()) <= 62
  assert short == f"{title}: y"  # a title that fits stays one line


def _plain_experiment(entries):
  """An experiment module defined in place (a plain problem on two clients) and its config."""
  import types

  import jax.numpy as jnp
  import ml_collections

  from fedco import experiment

  module = types.ModuleType("plain_only")
  module.TABLE_KEYS, module.PROGRESS = ("objective",), "objective"
  data = fedco.FederatedData.from_clients([{"x": np.ones((4, 2), np.float32)}] * 2)
  loss = lambda w, e: jnp.sum((w - e["x"]) ** 2)
  module.build = lambda config, method, seed, prepared: experiment.Run(
    fedco.plain(loss), method.build(), data, jnp.zeros(2)
  )
  fields = dict(seeds=(0,), rounds=2, local_steps=1, learning_rate=0.1, batch_size=0)
  config = ml_collections.ConfigDict(
    dict(
      experiment="plain_only", eval_every=1, **fields, methods=experiment.method_entries(entries)
    )
  )
  return module, config


def test_a_method_of_the_wrong_kind_is_refused_before_anything_runs(tmp_path):
  entries = {"a_fedavg": {"algorithm": "fedavg"}, "b_comfedl": {"algorithm": "comfedl"}}
  module, config = _plain_experiment(entries)
  with pytest.raises(ValueError, match=r"^--config\.methods\.b_comfedl\.algorithm: comfedl needs"):
    runner.train_and_evaluate(config, tmp_path / "run", QUIET, module=module)
  assert not (tmp_path / "run").exists()  # fedavg, first, did not run either


@pytest.mark.parametrize(
  "name, value, message",
  [
    ("summarise", lambda config, outcome: {}, r"defines summarise, .*did you mean summarize\?"),
    ("TABLE_KEY", ("objective",), r"defines TABLE_KEY, .*did you mean TABLE_KEYS\?"),
    ("Plot", lambda wd, config, outcome: None, r"defines Plot, .*did you mean plot\?"),
    ("plot", "figure.png", r"plot must be a function plot\(wd, config, outcome\)"),
    ("report", lambda: [], r"report\(\) cannot take the runner's arguments report\(summary\)"),
    ("TRADEOFF", [("accuracy", "acc")], r"TRADEOFF must be a Mapping"),
  ],
)
def test_a_misspelled_or_malformed_hook_is_refused_naming_the_hooks(tmp_path, name, value, message):
  module, config = _plain_experiment({"fedavg": {"algorithm": "fedavg"}})
  setattr(module, name, value)
  with pytest.raises(ValueError, match=message) as refused:
    runner.train_and_evaluate(config, tmp_path / "run", QUIET, module=module)
  assert "the hooks are TABLE_KEYS, PROGRESS" in str(refused.value)
  assert "\n" not in str(refused.value) and not (tmp_path / "run").exists()


def test_a_missing_required_hook_is_named():
  module, config = _plain_experiment({"fedavg": {"algorithm": "fedavg"}})
  del module.PROGRESS
  with pytest.raises(ValueError, match=r"^experiment plain_only defines no PROGRESS; the hooks"):
    runner.check(config, module)


def test_an_experiment_class_runs_as_a_module_does(tmp_path):
  from fedco import experiment

  module, config = _plain_experiment({"fedavg": {"algorithm": "fedavg"}})

  class Plain(experiment.Experiment):
    TABLE_KEYS, PROGRESS = module.TABLE_KEYS, module.PROGRESS

    def build(self, config, method, seed, prepared):
      return module.build(config, method, seed, prepared)

    def report(self, summary):
      return [f"{len(summary['table'])} method"]

  as_class = runner.train_and_evaluate(config, tmp_path / "class", QUIET, module=Plain())
  as_module = runner.train_and_evaluate(config, tmp_path / "module", QUIET, module=module)
  assert as_class["table"] == as_module["table"]
  assert experiment.protocol.of(Plain()).report(as_class) == ["1 method"]


def test_an_experiment_module_without_build_is_named():
  with pytest.raises(ValueError, match=r"module json defines no build\(config"):
    runner.experiment_module("json")
  with pytest.raises(ValueError, match=r"on the Python path .*got 'no_such_module'"):
    runner.experiment_module("no_such_module")


def test_plotting_a_run_still_going_draws_its_rows_so_far(tmp_path):
  from fedco.experiment import plot

  wd = outputs.Workdir(tmp_path)  # a run that has not completed: rows in in_progress/ only
  with open(wd.record(wd.file(outputs.METRICS)), "w") as f:
    for r in (1, 2):
      f.write(json.dumps({"method": "sgd", "seed": 0, "round": r, "loss": 1.0 / r}) + "\n")
  assert plot.plot(str(tmp_path), ["loss"]) == str(tmp_path / "plot.png")
  with pytest.raises(FileNotFoundError, match="is not a directory"):
    plot.plot(str(tmp_path / "elsewhere"), ["loss"])


def test_a_rerun_with_fewer_methods_says_the_others_results_are_replaced(tmp_path, capsys):
  entries = {"fedavg": {"algorithm": "fedavg"}, "fedprox": {"algorithm": "fedprox", "mu": 0.1}}
  module, config = _plain_experiment(entries)
  runner.train_and_evaluate(config, tmp_path, QUIET, module=module)
  del config.methods["fedprox"]  # what --methods=fedavg does
  capsys.readouterr()
  runner.train_and_evaluate(config, tmp_path, QUIET, module=module)
  assert "holds the results of fedprox, which this run leaves out" in capsys.readouterr().err
