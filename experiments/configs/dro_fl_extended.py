"""E1 with SCAFFOLD, FedProx and FedAdam beside the paper's methods (off by default: their 9
runs add about 70% to the main job's time): ``python -m experiments.main
--config=experiments/configs/dro_fl_extended.py --workdir=runs/e1-extended``."""

from experiments import configs
from experiments.configs import dro_fl


def get_config():
  config = dro_fl.get_config()
  # FedAvg's variants at their papers' client means: SCAFFOLD's and FedAdam's uniform,
  # FedProx's by data size (as fedavg here); FedAdam's server rate is not the paper's (it
  # tunes it per task).
  config.methods = configs.methods(
    {
      **config.methods.to_dict(),
      **{
        "scaffold": {"algorithm": "scaffold", "server_lr": 1.0},
        "fedprox": {"algorithm": "fedprox", "mu": 0.01, "weighting": "samples"},
        "fedadam": {"algorithm": "fedadam", "server_lr": 0.01},
      },
    }
  )
  return config
