"""experiments.merge_workdirs: workdirs of one experiment run in parts, merged by seed."""

import json

import numpy as np
import pytest

from experiments import merge_workdirs


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
  rows = merge_workdirs.final_rows([a, b], ["acc"])
  assert rows["fedavg_x"][0] == {"round": 100, "acc": 0.5}
  methods, incomplete, expected = merge_workdirs.summarize(rows, ["acc"], {"afl": 2000})
  assert expected == {"fedavg": 100, "afl": 2000}
  assert incomplete == ["afl_x seed 1"] and "afl_x" not in methods
  entry = methods["fedavg_x"]
  assert entry["seeds"] == [0, 1] and entry["acc"]["mean"] == pytest.approx(0.6)
  assert entry["acc"]["stderr"] == pytest.approx(np.std([0.5, 0.7], ddof=1) / np.sqrt(2))
  with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
    merge_workdirs.metrics_file(str(tmp_path))
