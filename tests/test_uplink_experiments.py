"""The privacy and compression modes of E6, E7 and the Adult DRO-FL benchmark, and the
config fields every method may carry (``privacy``, ``compression``, ``curve``)."""

import importlib
import json
import os

import ml_collections
import pytest

import fedco
from experiments import fair_adult
from fedco.experiment import config_methods, runner
from tests import helpers

MODES = (
  ("fair_adult", "privacy"),
  ("fair_adult", "compression"),
  ("fedavg_counterexample", "compression"),
  ("adult_dro", "privacy"),
)


def _config(name, mode):
  """The variant file ``experiments/configs/<name>_<mode>.py``'s config."""
  return importlib.import_module(f"experiments.configs.{name}_{mode}").get_config()


@pytest.mark.parametrize("name, mode", MODES)
def test_each_mode_builds_its_private_or_compressed_methods(name, mode):
  config = _config(name, mode)
  importlib.import_module(f"experiments.{name}").check(config)
  methods = runner.methods(config, extra_keys=("problem",))
  setting = "privacy" if mode == "privacy" else "compression"
  points = [m for m in methods if setting in m.uplink]
  # every mode compares with a plain method: some curve is drawn against its dashed line
  assert points and {m.curve for m in points} & {x.label for x in methods}
  for m in points:
    kwargs = m.simulator_kwargs()
    if setting == "privacy":
      assert isinstance(kwargs["privacy"], fedco.privacy.ClientDP)
      assert kwargs["privacy"].epsilon in (1.0, 2.0, 8.0, 64.0)
    else:
      assert all(isinstance(c, fedco.compression.Codec) for c in kwargs["compression"].values())
    # each point has its own checkpoint hash: its settings name the setting
    assert setting in m.settings()


@pytest.mark.parametrize(
  "mode, changes, message",
  [
    (
      "privacy",
      {"methods.feddro_eps8.privacy.epsilon": -1.0},
      r"--config.methods.feddro_eps8.privacy: epsilon must be > 0",
    ),
    (
      "privacy",
      {"methods.feddro_eps8.privacy.sigma": 1.0},
      r"--config.methods.feddro_eps8.privacy.sigma is not a privacy setting",
    ),
    (
      "compression",
      {"methods.feddro_q4.compression.y.codec": "zip"},
      r"--config.methods.feddro_q4.compression.y.codec must be one of \('quantize', 'top_k', 'adaptive'\)",
    ),
    (
      "compression",
      {"methods.feddro_q4.compression.y.fraction": 0.5},
      r"--config.methods.feddro_q4.compression.y.fraction is not a quantize setting",
    ),
    (
      "compression",
      {"methods.feddro_q4.compression.y.bits": 0},
      r"--config.methods.feddro_q4.compression.y: bits must be",
    ),
  ],
)
def test_bad_method_privacy_or_compression_is_one_line_naming_it(mode, changes, message):
  config = helpers.override(_config("fair_adult", mode), changes)
  with pytest.raises(ValueError, match=message):  # the experiment's check builds its methods
    fair_adult.check(config)


@pytest.mark.parametrize(
  "entry, message",
  [
    ({"privacy": {"epsilon": 1.0}}, r"--config.methods.m.privacy: .*'clip'"),
    ({"compression": {"y": {"codec": "quantize"}}}, r"--config.methods.m.compression.y: .*'bits'"),
  ],
)
def test_a_missing_privacy_or_codec_setting_is_one_line_naming_it(entry, message):
  with pytest.raises(ValueError, match=message):
    config_methods.uplink_settings("--config.methods.m", ml_collections.ConfigDict(entry))


def test_e7_compression_mode_reports_bytes_and_the_tradeoff(tmp_path):
  config = helpers.override(
    _config("fedavg_counterexample", "compression"), {"rounds": 30, "eval_every": 10, "seeds": (0,)}
  )
  with config.unlocked():
    config.methods = {
      k: config.methods[k] for k in ("feddro", "feddro_y3bit", "feddro_y3bit_adaptive")
    }
  summary = runner.train_and_evaluate(config, str(tmp_path), runner.Options(progress=False))
  points = {p["method"]: p for p in summary["bytes_up_tradeoff"]["points"]}
  # x once and y 5 times per round and client: 6 float32 against 4 + 5 * 3 bits
  assert points["feddro"]["bytes_up"] == 30 * 2 * 6 * 4
  assert points["feddro_y3bit"]["bytes_up"] == 30 * 2 * (4 + 5 * 3 / 8)
  assert points["feddro_y3bit_adaptive"]["bytes_up"] == points["feddro_y3bit"]["bytes_up"]
  # after 30 rounds the plain run is at 3e-10 (float32 round-off near x*): the fixed grid's
  # noise keeps x off it, the adaptive grid shrinks with the tracker and gets there too
  assert points["feddro"]["objective"] < 1e-8
  assert points["feddro_y3bit"]["objective"] > 1e-6
  assert points["feddro_y3bit_adaptive"]["objective"] < 1e-8
  assert os.path.isfile(tmp_path / "compression.png")
  with open(tmp_path / "summary.json") as f:
    assert json.load(f)["bytes_up_tradeoff"]["figure"] == "compression.png"


def test_e6_privacy_mode_reports_epsilon_per_method(tmp_path):
  config = helpers.override(
    _config("fair_adult", "privacy"),
    {"rounds": 4, "eval_every": 2, "seeds": (0,), "num_clients": 40, "clients_per_round": 10},
  )
  with config.unlocked():
    config.methods = {k: config.methods[k] for k in ("feddro", "feddro_eps1")}
  summary = runner.train_and_evaluate(config, str(tmp_path), runner.Options(progress=False))
  points = {p["method"]: p for p in summary["epsilon_tradeoff"]["points"]}
  assert points["feddro"]["epsilon"] is None
  assert points["feddro_eps1"]["epsilon"] == pytest.approx(1.0, rel=1e-3)
  assert os.path.isfile(tmp_path / "privacy.png")
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  private = [r for r in rows if r["method"] == "feddro_eps1"]
  assert [r["round"] for r in private] == [1, 2, 4]
  assert 0 < private[0]["epsilon"] < private[-1]["epsilon"] <= 1.0 + 1e-6
