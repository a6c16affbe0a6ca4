"""E7 with FedDRO's every-step ``y`` quantized (``fedco.compression``), against the bytes its
clients send up: ``python -m experiments.main
--config=experiments/configs/fedavg_counterexample_compression.py --workdir=runs/e7c``."""

from experiments import configs
from experiments.configs import fedavg_counterexample

# y is one number per message: a per-message range would cost two floats, so the quantizer
# uses the fixed grid [-Y_SCALE, Y_SCALE] (|y_k - y_bar| = beta |g_k - y_bar| stays within 2
# on this instance from x0 = 0).
Y_SCALE = 2.0


def get_config():
  config = fedavg_counterexample.get_config()
  config.seeds = (0, 1, 2)  # stochastic rounding makes the runs random: three seeds
  feddro = {"algorithm": "feddro", "beta": config.methods.feddro.beta}
  config.methods = configs.methods(
    {
      "feddro": feddro,
      **{
        f"feddro_y{bits}bit": {
          **feddro,
          "curve": "feddro",
          "compression": {"y": {"codec": "quantize", "bits": bits, "scale": Y_SCALE}},
        }
        for bits in (8, 4, 3, 2)
      },
      **{
        # ADPCM: each client's change from its last decoded y on a grid that shrinks as the
        # tracker settles, so the error vanishes at convergence
        f"feddro_y{bits}bit_adaptive": {
          **feddro,
          "curve": "feddro_adaptive",
          "compression": {"y": {"codec": "adaptive", "bits": bits, "initial_scale": Y_SCALE}},
        }
        for bits in (4, 3)
      },
    }
  )
  return config
