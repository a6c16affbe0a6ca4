"""Misuse of the experiment driver and its workdir: one ``error:`` line instead of a traceback,
nothing of a user's overwritten, nothing of a killed run's left behind, no noise from a damaged
checkpoint."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import fedco
from fedco.experiment import outputs
from tests import helpers

E7_CONFIG = "--config=experiments/configs/fedavg_counterexample.py"
ENV = {**os.environ, "PYTHONPATH": str(helpers.ROOT)}


def _driver(*args, timeout=120):
  return helpers.run(
    [sys.executable, "-m", "experiments.main", *args],
    cwd=helpers.ROOT,
    env=ENV,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def _one_error_line(proc, *fragments):
  """``proc`` exited 1 with exactly one ``error: ...`` line holding ``fragments``."""
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 1, proc.stderr
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
  for fragment in fragments:
    assert fragment in lines[0], (fragment, lines[0])
  return lines[0]


# ---- 1: a killed write's temporary file goes with the next run ----------------------------


def test_a_rerun_removes_the_temporary_files_of_a_write_killed_midway(tmp_path):
  """A SIGKILL during ``atomic_write`` leaves its ``.tmp-<name>.<random>`` file; the next
  Workdir on the directory (holding its lock) removes those of the files fedco writes there,
  and nothing of a user's, even named alike."""
  run = tmp_path / "run"
  wd = outputs.Workdir(run)
  wd.write_config({"a": 1})
  wd.write_summary({"done": True})
  del wd
  code = textwrap.dedent("""
      import os, sys, time
      from fedco.experiment import outputs
      wd = outputs.Workdir(sys.argv[1])
      def stall(f):
        f.write("[")
        print("writing", flush=True)
        time.sleep(60)
      outputs.atomic_write(os.path.join(wd.path, outputs.MANIFEST), stall)
      """)
  child = subprocess.Popen(
    [sys.executable, "-c", code, str(run)],
    cwd=helpers.ROOT,
    env=ENV,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert child.stdout.readline().strip() == "writing"
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait()
  stale = [n for n in os.listdir(run) if n.startswith(".tmp-.fedco-written.json.")]
  assert len(stale) == 1, os.listdir(run)
  ours = [".tmp-summary.json.a1b2c3d4", ".tmp-config.json.zz_9yy8x"]
  users = [
    ".tmp-mine",
    ".tmp-notes.txt.a1b2c3d4",
    ".tmp-summary.json.bak",
    ".tmp-summary.json.a1b2c3d4.keep",
    ".tmp-plot.png.a1b2c3d4",
  ]  # fedco.experiment.plot writes figures without the lock
  for name in ours + users:
    (run / name).write_text("x")
  (run / ".tmp-metrics.jsonl.dir12345").mkdir()  # a directory is never ours
  outputs.Workdir(run)
  left = set(os.listdir(run))
  assert not left & set(stale + ours), sorted(left)
  assert set(users) | {".tmp-metrics.jsonl.dir12345"} <= left, sorted(left)
  assert json.loads((run / "summary.json").read_text()) == {"done": True}


def test_stale_temporary_files_are_left_while_another_process_holds_the_lock(tmp_path):
  run = tmp_path / "run"
  code = (
    "import sys, time; from fedco.io import DirectoryLock; "
    "lock = DirectoryLock(sys.argv[1]).acquire(); print('held', flush=True); "
    "time.sleep(60)"
  )
  holder = subprocess.Popen(
    [sys.executable, "-c", code, str(run)],
    cwd=helpers.ROOT,
    env=ENV,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "held"
    (run / ".tmp-.fedco-written.json.abcd1234").write_text("[")  # its write in progress
    with pytest.raises(ValueError, match="in use"):
      outputs.Workdir(run)
    assert (run / ".tmp-.fedco-written.json.abcd1234").exists()
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()


# ---- 2: a damaged checkpoint: the fallback, without orbax/TensorStore noise ----------------


def test_a_truncated_checkpoint_falls_back_without_noise(tmp_path):
  """A truncated file in the newest checkpoint: restore warns in one line and uses the older;
  the restore's reads still in flight when it failed make no tracebacks ("Event loop is
  closed", "Exception ignored in: <coroutine ...>") on stderr."""
  code = textwrap.dedent("""
      import gc, glob, os, pathlib, sys, time, warnings
      import numpy as np
      from fedco import checkpoint
      root = pathlib.Path(sys.argv[1])
      template = {f"w{i}": np.arange(4000.0 * (i + 1), dtype=np.float32) for i in range(30)}
      for trial in range(4):
        ckpt = checkpoint.Checkpointer(root / str(trial))
        for r in (1, 2):
          ckpt.save(r, template, {"objective": np.zeros(r)})
        state = root / str(trial) / "2" / "state"
        if trial % 2:  # the index (read for the arrays' metadata first)
          files = [pathlib.Path(f) for f in glob.glob(str(state / "d" / "*"))]
        else:  # the biggest array data file
          files = [max(state.glob("ocdbt.process_0/d/*"), key=os.path.getsize)]
        assert files
        for f in files:
          f.write_bytes(f.read_bytes()[: f.stat().st_size // 10])
        with warnings.catch_warnings(record=True) as caught:
          warnings.simplefilter("always")
          round_, state, _ = ckpt.restore(template)
        assert round_ == 1, round_
        assert all(np.array_equal(state[k], template[k]) for k in template)
        assert [str(w.message).count("\\n") for w in caught] == [0], caught  # one line
        print("resumed from round 1:", str(caught[0].message)[:300])
      del ckpt
      gc.collect()
      time.sleep(0.5)  # reads finishing after the restore would report now
      gc.collect()
      """)
  proc = helpers.run(
    [sys.executable, "-c", code, str(tmp_path)],
    cwd=helpers.ROOT,
    env=ENV,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.count("resumed from round 1") == 4
  assert proc.stderr.strip() == "", proc.stderr[:3000]
  assert "TensorStore details: <bound method" not in proc.stdout  # the cause, not orbax' wrap


# ---- 3, 5: outputs in the way are refused before the run starts ---------------------------


@pytest.mark.parametrize(
  "name", [outputs.SUMMARY, outputs.METRICS, outputs.METRICS_CSV, outputs.CONFIG, outputs.MANIFEST]
)
def test_a_directory_where_fedco_writes_a_file_is_refused_at_the_start(tmp_path, name):
  run = tmp_path / "run"
  wd = outputs.Workdir(run)
  wd.write_config({"a": 1})
  for output, writer in (
    (outputs.METRICS, fedco.runtime.JsonlWriter),
    (outputs.METRICS_CSV, fedco.runtime.CsvWriter),
  ):
    writer(wd.record(wd.file(output))).write([{"round": 1, "x": 0.5}])  # as the runner does
  wd.write_summary({"done": True})
  del wd
  os.remove(run / name)
  (run / name).mkdir()
  (run / name / "keep").write_text("mine")
  with pytest.raises(ValueError, match=f"{name}.*directory.*move it away") as err:
    outputs.Workdir(run)
  assert "\n" not in str(err.value) and str(run / name) in str(err.value)
  assert (run / name / "keep").read_text() == "mine"
  assert not (run / outputs.STAGING).exists()


def test_the_driver_refuses_a_summary_directory_in_one_line(tmp_path):
  (tmp_path / "summary.json").mkdir()
  proc = _driver(E7_CONFIG, f"--workdir={tmp_path}", "--config.rounds=2", "--noprogress")
  _one_error_line(proc, str(tmp_path / "summary.json"), "directory", "move it away")
  assert os.listdir(tmp_path / "summary.json") == []


def test_a_users_own_outputs_in_a_fresh_workdir_are_refused(tmp_path):
  (tmp_path / "summary.json").write_text('{"mine": 1}')
  (tmp_path / "metrics.csv").write_text("mine\n")
  (tmp_path / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="did not write") as err:
    outputs.Workdir(tmp_path)
  message = str(err.value)
  assert "\n" not in message
  assert "summary.json" in message and "metrics.csv" in message and "notes.txt" not in message
  assert "move them away or use another workdir" in message
  assert (tmp_path / "summary.json").read_text() == '{"mine": 1}'
  assert (tmp_path / "metrics.csv").read_text() == "mine\n"
  assert not (tmp_path / outputs.STAGING).exists()
  os.remove(tmp_path / "summary.json")
  os.remove(tmp_path / "metrics.csv")
  wd = outputs.Workdir(tmp_path)  # a user's other files are no obstacle
  wd.write_summary({"ours": 1})
  del wd
  outputs.Workdir(tmp_path)  # and fedco's own (in the manifest) are replaced as before
  assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_driver_refuses_a_users_summary_in_one_line(tmp_path):
  (tmp_path / "summary.json").write_text('{"mine": 1}')
  proc = _driver(E7_CONFIG, f"--workdir={tmp_path}", "--config.rounds=2", "--noprogress")
  _one_error_line(proc, "summary.json", "did not write", "another workdir")
  assert (tmp_path / "summary.json").read_text() == '{"mine": 1}'


# ---- 4: --config and --flagfile that name no usable file ---------------------------------


@pytest.mark.parametrize(
  "args",
  [
    ["--config=experiments/configs/nope.py", "--config.rounds=2"],
    ["--config=experiments/configs/nope.py:grid", "--config.seeds=0,"],
    ["--config", "experiments/configs/nope.py", "--config.rounds=2"],
    ["--config=README.md"],
    ["--config=README.md", "--config.rounds=2"],
    ["--config=experiments/configs"],
  ],
)
def test_a_config_that_is_no_config_file_is_one_error_line(tmp_path, args):
  proc = _driver(*args, f"--workdir={tmp_path / 'run'}")
  line = _one_error_line(
    proc,
    "--config",
    "is not a config file",
    "fedavg_counterexample",
    "dro_fl",
    "experiments/configs/",
  )
  assert args[0].split("=")[-1].split(":")[0] in line or args[1] in line
  assert not (tmp_path / "run").exists()


def test_a_config_file_that_fails_to_load_is_one_error_line(tmp_path):
  broken = tmp_path / "broken.py"
  broken.write_text("def get_config(:\n")
  proc = _driver(f"--config={broken}", "--config.rounds=2", f"--workdir={tmp_path / 'run'}")
  _one_error_line(proc, "--config", str(broken), "SyntaxError")
  plain = tmp_path / "plain.py"
  plain.write_text("X = 1\n")
  proc = _driver(f"--config={plain}", f"--workdir={tmp_path / 'run'}")
  _one_error_line(proc, "--config", "is not a config file", "get_config")


@pytest.mark.parametrize("case", ["missing", "missing, no --config", "directory", "nested"])
def test_a_flagfile_that_cannot_be_read_is_one_error_line(tmp_path, case):
  """Also before ``--config`` is looked at (ml_collections reads the flag files as the
  driver's module is imported)."""
  missing = tmp_path / "missing.flags"
  named = {"directory": tmp_path}.get(case, missing)
  flagfile = named
  if case == "nested":
    flagfile = tmp_path / "outer.flags"
    flagfile.write_text(f"--config.rounds=2\n--flagfile={missing}\n")
  args = [] if "no --config" in case else [E7_CONFIG]
  proc = _driver(*args, f"--flagfile={flagfile}", f"--workdir={tmp_path / 'run'}")
  _one_error_line(
    proc,
    "--flagfile",
    str(named),
    "Is a directory" if case == "directory" else "No such file",
    "a readable file of flags",
  )
  assert not (tmp_path / "run").exists()
