"""experiments.merge_workdirs: workdirs of one experiment run in parts, merged by seed."""

import json
import shlex
import sys

import numpy as np
import pytest

from experiments import merge_workdirs
from fedco import experiment
from tests import helpers

check_tables = helpers.docs_program("check_tables")


def _workdir(path, rows, finished=True):
  folder = path if finished else path / "in_progress"
  folder.mkdir(parents=True)
  with open(folder / "metrics.jsonl", "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  return str(path)


def test_runs_split_over_workdirs_merge_by_seed_and_cut_runs_are_left_out(tmp_path):
  row = lambda m, s, r, acc: {"method": m, "seed": s, "round": r, "acc": acc, "loss": 1.0}
  a = _workdir(tmp_path / "a", [row("fedavg_x", 0, 50, 0.1), row("fedavg_x", 0, 100, 0.5)])
  b = _workdir(
    tmp_path / "b",
    [row("fedavg_x", 1, 100, 0.7), row("afl_x", 1, 1000, 0.2), {"method": "afl_x", "seed": 1, "round": 5}],
    finished=False,
  )  # fmt: skip
  rows = merge_workdirs.final_rows(merge_workdirs.load([a, b]), ["acc"])
  assert rows["fedavg_x"][0] == {"round": 100, "acc": 0.5}
  methods, incomplete, expected = merge_workdirs.summarize(rows, ["acc"], {"afl": 2000})
  assert expected == {"fedavg": 100, "afl": 2000}
  assert incomplete == ["afl_x seed 1"] and "afl_x" not in methods
  entry = methods["fedavg_x"]
  assert entry["seeds"] == [0, 1] and entry["acc"]["mean"] == pytest.approx(0.6)
  assert entry["acc"]["stderr"] == pytest.approx(np.std([0.5, 0.7], ddof=1) / np.sqrt(2))
  with pytest.raises(FileNotFoundError, match="nor a workdir with metrics.jsonl"):
    merge_workdirs.metrics_file(str(tmp_path))


def test_metrics_files_merge_at_one_round_and_pair_by_seed(tmp_path):
  """Kept ``.jsonl``/``.csv`` files are sources too; ``at_round`` compares runs of different
  lengths at one round; ``paired`` is each label minus the reference on the common seeds."""
  csv_file = tmp_path / "fedavg_seed0.csv"
  csv_file.write_text("round,method,seed,acc\n50,fedavg,0,0.40\n100,fedavg,0,0.50\n")
  jsonl = tmp_path / "others.jsonl"
  rows = [
    {"method": "fedavg", "seed": 1, "round": 50, "acc": 0.30},
    {"method": "fedadam", "seed": 0, "round": 50, "acc": 0.43},
    {"method": "fedadam", "seed": 1, "round": 50, "acc": 0.29},
    {"method": "fedavg", "seed": 2, "round": 50, "acc": 0.9},
    {"method": "fedadam", "seed": 2, "round": 50, "acc": 0.9},  # a tie is not ahead
    {"method": "fedyogi", "seed": 3, "round": 50, "acc": 0.9},  # no FedAvg seed 3: unpaired
    {"method": "scaffold", "seed": 0, "round": 40, "acc": 0.1},  # never reached round 50
  ]
  jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
  sources = [str(csv_file), str(jsonl)]
  assert merge_workdirs.metrics_file(str(csv_file)) == str(csv_file)
  rows = merge_workdirs.final_rows(merge_workdirs.load(sources), ["acc"], at_round=50)
  assert rows["fedavg"][0] == {"round": 50, "acc": pytest.approx(0.40)}  # not round 100's
  methods, incomplete, _ = merge_workdirs.summarize(rows, ["acc"], {}, at_round=50)
  assert incomplete == ["scaffold seed 0"]
  pairs = merge_workdirs.paired(methods, "fedavg", ["acc"])
  assert set(pairs) == {"fedadam"} and pairs["fedadam"]["seeds"] == [0, 1, 2]
  diff = pairs["fedadam"]["acc"]
  assert diff["mean"] == pytest.approx(0.02 / 3) and diff["ahead"] == 1
  assert diff["stderr"] == pytest.approx(np.std([0.03, -0.01, 0.0], ddof=1) / np.sqrt(3))
  with pytest.raises(ValueError, match="paired_with='fedprox': no finished runs"):
    merge_workdirs.paired(methods, "fedprox", ["acc"])


def test_curves_average_each_round_over_the_finished_seeds_only(tmp_path):
  rows = [
    {"method": "fedavg", "seed": s, "round": r, "acc": a}
    for s, r, a in [(0, 10, 0.1), (0, 20, 0.3), (1, 10, 0.3), (1, 20, 0.5), (1, 15, 0.9)]
    + [(3, 10, 0.2), (3, 20, 0.4)]
  ] + [{"method": "fedavg", "seed": 2, "round": 10, "acc": 0.0}]  # seed 2 cut short
  jsonl = tmp_path / "m.jsonl"
  jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
  records = merge_workdirs.load([str(jsonl)])
  methods, incomplete, _ = merge_workdirs.summarize(
    merge_workdirs.final_rows(records, ["acc"]), ["acc"], {}
  )
  assert incomplete == ["fedavg seed 2"]
  picked = merge_workdirs.curve_rows(records, "acc", methods)
  # round 15 is seed 1's only, seed 2 never finished: both left out
  kept = sorted((r["seed"], r["round"]) for r in picked)
  assert kept == [(0, 10), (0, 20), (1, 10), (1, 20), (3, 10), (3, 20)]
  fig = experiment.curves(picked, ["fedavg"], [("acc", "acc")], band="stderr")
  ax = fig.axes[0]
  assert list(ax.lines[0].get_xdata()) == [10, 20]
  assert ax.lines[0].get_ydata() == pytest.approx([0.2, 0.4])
  band = ax.collections[0].get_paths()[0].vertices  # mean +- standard error: 0.1 / sqrt(3)
  se = np.std([0.1, 0.3, 0.2], ddof=1) / np.sqrt(3)
  for x, mean in ((10, 0.2), (20, 0.4)):
    ys = band[np.isclose(band[:, 0], x), 1]
    assert (ys.min(), ys.max()) == (pytest.approx(mean - se), pytest.approx(mean + se))
  with pytest.raises(ValueError, match="band must be 'std' or 'stderr'"):
    experiment.curves(picked, ["fedavg"], [("acc", "acc")], band="sem")


def test_runs_a_summary_says_diverged_are_neither_finished_nor_incomplete(tmp_path):
  """Every DA-MAML seed diverged at round 2 after evaluating round 0 only: by the rows alone
  round 0 is the largest its algorithm reached, so they would pass as finished."""
  rows = [
    {"method": m, "seed": s, "round": 0, "acc": 0.2} for m in ("comfedl_damaml", "fedavg") for s in (0, 1)
  ] + [{"method": "fedavg", "seed": s, "round": 10, "acc": 0.3} for s in (0, 1)]  # fmt: skip
  workdir = _workdir(tmp_path / "w", rows)
  note = "diverged at round 2 (model); try a lower --config.methods.comfedl_damaml.learning_rate"
  per_seed = {"0": {"diverged": note, "diverged_round": 2}, "1": {"diverged": note}}
  summary = {"methods": {"comfedl_damaml": {"per_seed": per_seed}, "fedavg": {"per_seed": {}}}}
  (tmp_path / "w" / "summary.json").write_text(json.dumps(summary))
  found = merge_workdirs.summaries([workdir, str(tmp_path / "no_summary")])
  assert found == [summary]  # a source without summary.json has none
  diverged = merge_workdirs.diverged_runs(found)
  assert diverged == {"comfedl_damaml": {"0": note, "1": note}}
  rows = merge_workdirs.without(
    merge_workdirs.final_rows(merge_workdirs.load([workdir]), ["acc"]), diverged
  )
  methods, incomplete, _ = merge_workdirs.summarize(rows, ["acc"], {})
  assert list(methods) == ["fedavg"] and incomplete == []


def test_labels_keep_only_the_named_methods_and_an_absent_one_is_named(tmp_path):
  rows = [{"method": m, "seed": 0, "round": 5, "acc": 0.5} for m in ("feddro", "mbsgd", "fastdro")]
  records = merge_workdirs.load([_workdir(tmp_path / "w", rows)])
  assert [r["method"] for r in merge_workdirs.only(records, ["feddro", "fastdro"])] == [
    "feddro", "fastdro"
  ]  # fmt: skip
  assert merge_workdirs.only(records, []) == records
  with pytest.raises(
    ValueError, match=r"labels=ds_feddro: not in the sources; labels: \['fastdro'"
  ):
    merge_workdirs.only(records, ["feddro", "ds_feddro"])


def test_a_damaged_summary_is_one_line_naming_it(tmp_path):
  workdir = _workdir(tmp_path / "w", [{"method": "a", "seed": 0, "round": 1, "acc": 0.5}])
  (tmp_path / "w" / "summary.json").write_text("{oops")
  with pytest.raises(ValueError, match=r"w/summary.json: not a JSON summary") as err:
    merge_workdirs.summaries([workdir])
  assert "\n" not in str(err.value)


def test_a_key_the_rows_lack_is_taken_from_the_summarys_finals(tmp_path):
  """E4 evaluates test accuracy once, at the end, into ``summary.json`` only: the merge takes
  those finals; a run whose rows carry every key keeps its rows' final."""
  rows = [
    {"method": m, "seed": 0, "round": r, "val_acc": 0.1 * r} for m in ("bsgd", "scgdm") for r in (1, 2)
  ] + [{"method": "fedavg", "seed": 0, "round": 2, "val_acc": 0.5, "test_acc": 0.4}]  # fmt: skip
  workdir = _workdir(tmp_path / "w", rows)
  final = lambda test: {"round": 2, "val_acc": 0.7, "test_acc": test, "seconds": 9.0}
  summary = {
    "methods": {
      "bsgd": {"per_seed": {"0": final(0.25), "2": final(0.2)}, "val_acc": {"mean": 0.2}},
      "scgdm": {"per_seed": {"0": final(0.3), "1": {"diverged": "at round 1"}}},
      "fedavg": {"per_seed": {"0": final(0.9)}},  # its rows carry test_acc: not used
      "other": {"per_seed": {"0": final(0.7)}},
    }
  }
  (tmp_path / "w" / "summary.json").write_text(json.dumps(summary))
  found = merge_workdirs.summaries([workdir])
  keys = ["val_acc", "test_acc"]
  labels = ["bsgd", "scgdm", "fedavg"]
  records = merge_workdirs.load([workdir])
  assert merge_workdirs.final_rows(records, keys).keys() == {"fedavg"}
  finals = merge_workdirs.only(merge_workdirs.summary_rows(found), labels)
  assert sorted((r["method"], r["seed"]) for r in finals) == [
    ("bsgd", 0), ("bsgd", 2), ("fedavg", 0), ("scgdm", 0)
  ]  # fmt: skip
  rows = merge_workdirs.final_rows(merge_workdirs.with_summaries(records, finals), keys)
  assert rows["bsgd"][0] == {"round": 2, "val_acc": 0.2, "test_acc": 0.25}
  assert rows["fedavg"][0] == {"round": 2, "val_acc": 0.5, "test_acc": 0.4}  # its rows'
  assert rows["bsgd"][2] == {"round": 2, "val_acc": 0.7, "test_acc": 0.2}  # no rows: the final
  methods, incomplete, _ = merge_workdirs.summarize(rows, keys, {})
  assert incomplete == [] and methods["scgdm"]["test_acc"]["mean"] == pytest.approx(0.3)
  pairs = merge_workdirs.paired(methods, "bsgd", keys)
  assert pairs["scgdm"]["seeds"] == [0]
  assert pairs["scgdm"]["test_acc"]["mean"] == pytest.approx(0.05)


def test_the_program_merges_e4_style_workdirs_in_one_command(tmp_path):
  rows = [
    {"method": m, "seed": s, "round": r, "val_acc": 0.2 * r, "train_loss": 1 / r}
    for m in ("a", "b") for s in (0, 1) for r in (1, 2)
  ]  # fmt: skip
  workdirs = []
  for s in (0, 1):
    workdirs.append(_workdir(tmp_path / f"w{s}", [r for r in rows if r["seed"] == s]))
    per = {m: {"per_seed": {str(s): {"round": 2, "test_acc": 0.1 * s + (m == "b")}}} for m in "ab"}
    command = f"python -m experiments.main --seeds={s}"
    (tmp_path / f"w{s}" / "summary.json").write_text(
      json.dumps({"methods": per, "wall_seconds": 5.0, "command": command})
    )
  out = tmp_path / "merged.json"
  argv = [
    f"--out={out}",
    "--keys=val_acc,test_acc",
    "--paired_with=a",
    f"--curves={tmp_path}/c.png",
    "--curve_keys=val_acc,train_loss",
    "--markdown",
    "--setting=E4 on two seeds",
    "--timing=5 s each",
    "--run_command=python -m experiments.main --cut_short",
  ]
  done = helpers.run(
    [sys.executable, "-m", "experiments.merge_workdirs", *argv, *workdirs],
    cwd=helpers.ROOT, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert done.returncode == 0, done.stderr[-2000:]
  merged = json.loads(out.read_text())
  assert merged["methods"]["b"]["test_acc"]["mean"] == pytest.approx(1.05)
  assert merged["paired"]["b"]["test_acc"]["ahead"] == 2
  assert merged["wall_seconds_of_finished_workdirs"] == 10.0 and (tmp_path / "c.png").exists()
  # what was run, how long it took, and every command that made the JSON, its own last
  assert (merged["setting"], merged["timing"]) == ("E4 on two seeds", "5 s each")
  assert merged["commands"] == [
    "python -m experiments.main --seeds=0",
    "python -m experiments.main --seeds=1",
    "python -m experiments.main --cut_short",
    "python -m experiments.merge_workdirs " + shlex.join([*argv, *workdirs]),
  ]
  # --markdown prints the guide's table under its mark, and docs/check_tables.py accepts it
  table = done.stdout[done.stdout.index("<!-- checked:") :]
  assert "| `b` | 0.400 +- 0.000 | 1.050 +- 0.050 | +0.00 +- 0.00 (0 of 2) |" in table
  (tmp_path / "guide.md").write_text(table)
  tables, errors = check_tables.check(tmp_path / "guide.md")
  assert (tables, errors) == (1, [])
  (tmp_path / "guide.md").write_text(table.replace("1.050 +- 0.050", "1.040 +- 0.050"))
  assert "b test_acc: 1.040 is not the mean" in check_tables.check(tmp_path / "guide.md")[1][0]
  records = merge_workdirs.load(workdirs)
  methods, _, _ = merge_workdirs.summarize(
    merge_workdirs.final_rows(records, ["val_acc"]), ["val_acc"], {}
  )
  fig = merge_workdirs.curve_figure(records, methods, ["val_acc", "train_loss"], "E4")
  assert [ax.get_title() for ax in fig.axes] == ["E4: val_acc", "E4: train_loss"]
  assert list(fig.axes[1].lines[0].get_ydata()) == pytest.approx([1.0, 0.5])
