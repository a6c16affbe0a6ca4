"""E7: FedAvg for compositional problems fails, FedDRO converges (paper 004, Theorem 4.1).

``python -m experiments.main --config=experiments/configs/fedavg_counterexample.py
--workdir=runs/e7``; e.g. ``--config.local_steps=1`` or ``--config.methods.feddro.beta=1``.
``fedavg_counterexample.py:compression`` runs FedDRO with its every-step ``y`` quantized
(``fedco.compression``) against the bytes its clients send up.
"""

import ml_collections

MODES = ("", "compression")
# y is one number per message: a per-message range would cost two floats, so the quantizer
# uses the fixed grid [-Y_SCALE, Y_SCALE] (|y_k - y_bar| = beta |g_k - y_bar| stays within 2 on this instance from x0 = 0).
Y_SCALE = 2.0


def get_config(mode: str = ""):
  """E7: two clients, one-dimensional ``x``, no noise (deterministic runs); ``mode``
  ``compression`` compares FedDRO with quantized ``y`` instead."""
  if mode not in MODES:
    raise ValueError(f"the fedavg_counterexample config's mode must be {MODES[1]!r} (or "
                     f"none), got {mode!r}")
  config = ml_collections.ConfigDict()
  config.experiment = "fedavg_counterexample"
  config.seeds = (0,)  # the runs are deterministic (no noise, full data): one seed suffices
  config.rounds = 400
  config.local_steps = 5  # I: local steps per round
  config.learning_rate = 0.02  # eta, every method
  config.batch_size = 0  # 0: each client's whole data (its one example); the only value
  config.eval_every = 1  # rounds between recorded |x_bar - x*| and |Phi'(x_bar)|
  config.x0 = 0.0  # the initial model x_bar_0
  config.methods = ml_collections.ConfigDict({
      "fedavg_co_case1": {"algorithm": "fedavg_co", "case": "I"},
      "fedavg_co_case2": {"algorithm": "fedavg_co", "case": "II"},
      "fedavg_co_modified": {"algorithm": "fedavg_co", "case": "modified"},
      "feddro": {"algorithm": "feddro", "beta": 0.5},  # hybrid-tracker beta in (0, 1]
  })
  if mode == "compression":
    # Stochastic rounding makes the runs random: three seeds.
    config.seeds = (0, 1, 2)
    feddro = config.methods.feddro.to_dict()
    config.methods = ml_collections.ConfigDict({"feddro": feddro, **{
        f"feddro_y{bits}bit": {**feddro, "curve": "feddro", "compression": {
            "y": {"codec": "quantize", "bits": bits, "scale": Y_SCALE}}}
        for bits in (8, 4, 3, 2)}, **{
        # ADPCM: each client's change from its last decoded y on a grid that shrinks as
        # the tracker settles, so the error vanishes at convergence
        f"feddro_y{bits}bit_adaptive": {**feddro, "curve": "feddro_adaptive", "compression": {
            "y": {"codec": "adaptive", "bits": bits, "initial_scale": Y_SCALE}}}
        for bits in (4, 3)}})
  return config
