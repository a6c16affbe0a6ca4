"""The device script of the papers' image experiments (benchmarks/paper_images.py): its
command lines, without running them (each is hours of an accelerator)."""

import sys
import types

import pytest

from benchmarks import paper_images as pi
from experiments import merge_workdirs  # noqa: F401  (its flags beside the program's: no clash)
from experiments.configs import imbalanced_cifar, omniglot
from tests import helpers


def _fields(cmd):
  return dict(a[len("--config.") :].split("=", 1) for a in cmd if a.startswith("--config."))


def test_full_length_commands_are_the_configs_with_their_overrides():
  cmd, run_dir = pi.command("e4_20w1s", 1.0, "/data", "runs/p")
  assert cmd[:3] == [sys.executable, "-m", "experiments.main"]
  assert cmd[3].endswith("experiments/configs/omniglot.py") and "--noprogress" in cmd
  fields = _fields(cmd)
  full = omniglot.get_config()
  assert fields["rounds"] == str(full.rounds) and fields["eval_every"] == str(full.eval_every)
  assert fields["ways"] == "20" and fields["data_dir"] == "/data/omniglot"
  assert run_dir == "runs/p/e4_20w1s_scale1" and f"--workdir={run_dir}" in cmd
  assert _fields(pi.command("e4_5w5s", 1.0, "/d", "w")[0])["shots"] == "5"
  twenty_five = _fields(pi.command("e4_20w5s", 1.0, "/d", "w")[0])
  assert (twenty_five["ways"], twenty_five["shots"]) == ("20", "5")


def test_scale_shortens_the_rounds_and_every_round_count_with_them():
  cmd, run_dir = pi.command("e5", 0.1, "/data", "w")
  fields, full = _fields(cmd), imbalanced_cifar.get_config()
  assert fields["rounds"] == str(round(full.rounds * 0.1))
  assert fields["lr_drop_round"] == str(round(full.lr_drop_round * 0.1))
  assert fields["eval_every"] == str(
    max(1, min(int(fields["rounds"]), round(full.eval_every * 0.1)))
  )
  assert fields["data_dir"] == "/data/cifar10_jpeg/cifar10_jpeg.tar.gz"
  assert run_dir == "w/e5_scale0.1"


def test_e5s_rate_grid_and_local_steps_ablation_are_runs_of_their_own():
  rates = {
    name: _fields(pi.command(name, 1.0, "/d", "w")[0])["learning_rate"]
    for name in pi.RUNS
    if name.startswith("e5_lr")
  }
  assert sorted(float(r) for r in rates.values()) == [0.001, 0.05, 0.1]  # 0.01: the config's
  assert imbalanced_cifar.get_config().learning_rate == 0.01
  fields = _fields(pi.command("e5_local_steps", 1.0, "/d", "w")[0])
  assert fields["ablation"] == "local_steps" and "learning_rate" not in fields
  assert len({pi.command(name, 1.0, "/d", "w")[1] for name in pi.RUNS}) == len(pi.RUNS)


@pytest.mark.parametrize(
  "flag,value,message",
  [
    ("runs", ["e4_50w"], "--runs: unknown"),
    ("scale", 0.0, "--scale must be in"),
    ("data_root", "/nonexistent", "--data_root="),
    ("timeout", -1, "--timeout must be"),
  ],
)
def test_bad_flags_are_one_line_naming_the_flag(tmp_path, monkeypatch, flag, value, message):
  for name in ("omniglot", "cifar10_jpeg/cifar10_jpeg.tar.gz"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).touch()
  settings = {"runs": ["e4_20w1s", "e5"], "scale": 1.0, "data_root": str(tmp_path), "timeout": 0}
  flags = types.SimpleNamespace(**settings)
  monkeypatch.setattr(pi, "FLAGS", flags)
  pi.check_flags()  # the good settings pass
  setattr(flags, flag, value)
  error = FileNotFoundError if flag == "data_root" else ValueError
  with pytest.raises(error, match=message) as err:
    pi.check_flags()
  assert "\n" not in str(err.value)


def test_the_program_defines_its_flags_when_run_and_refuses_in_one_line(tmp_path):
  out = helpers.run(  # the limit scaled to a busy machine (decision 97)
    [sys.executable, "-m", "benchmarks.paper_images", f"--out={tmp_path / 'x.json'}", "--scale=0"],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 1 and out.stderr.strip() == "error: --scale must be in (0, 1], got 0.0"
  assert not (tmp_path / "x.json").exists()
