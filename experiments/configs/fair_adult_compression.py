"""E6's FedDRO as it is and with its uploads (the model and the every-step ``y``) quantized or
sparsified, its objective against the bytes its clients send up: ``python -m
experiments.main --config=experiments/configs/fair_adult_compression.py --workdir=runs/e6c``."""

from experiments import configs
from experiments.configs import fair_adult


def get_config():
  config = fair_adult.get_config()
  entry = {**fair_adult.METHODS["feddro"], "curve": "feddro"}
  quantize = lambda bits: {"codec": "quantize", "bits": bits}
  config.methods = configs.methods(
    {
      "feddro": fair_adult.METHODS["feddro"],
      **{
        f"feddro_q{b}": {**entry, "compression": {"params": quantize(b), "y": quantize(b)}}
        for b in (8, 4, 2)
      },
      "feddro_top10": {
        **entry,
        "compression": {"params": {"codec": "top_k", "fraction": 0.1}, "y": quantize(4)},
      },
      # y alone: 7 of the 125 numbers a client sends each step, so at most 1.06x fewer bytes
      "feddro_y4": {**entry, "compression": {"y": quantize(4)}},
    }
  )
  return config
