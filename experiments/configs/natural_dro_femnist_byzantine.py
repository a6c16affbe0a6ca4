"""E8 on FEMNIST's writers with Byzantine writers (issue 48): each rule against each attack.

``python -m experiments.main --config=experiments/configs/natural_dro_femnist_byzantine.py
--workdir=runs/e8_femnist_byzantine``. E8's FEMNIST settings (105 writers, every writer
every round, logistic regression; FedAvg and FedDRO 100 rounds of 20 steps, AFL 2,000
rounds of one step) with 0, 10% or 20% of the writers Byzantine (10 or 21, the same writers
all run): sign-flipped uploads (``flip``), honest training on flipped labels (``labels``,
at 20%: label ``61 - y`` of FEMNIST's 62) and, for the DRO methods, loss reports inflated
tenfold (``inflate``, at 20%: FedDRO's ``y``, AFL's ``loss``). Labels as in
:mod:`experiments.configs.dro_fl_byzantine`: ``<algorithm>_<rule>_<attack>_<writers>``.

The rules at 105 writers: Multi-Krum assumes ``f = 21`` (``n > 2f + 2``) and averages the
``n - f = 84`` best; the trimmed mean drops 20% at each end; centered clipping's radius
``tau = 0.1`` is the median norm of an honest round's model change here (what adaptive
clipping converged to in ``e8_femnist_dp``: 0.10-0.13), not a value tuned for accuracy.
Krum (``f = 21``) keeps the one upload closest to its ``n - f - 2`` nearest. 3 algorithms x 6
rules x (clean + 2 flips + labels, + inflate for the two DRO methods) = 84 runs a seed.
Gaussian attackers are left to E1's grid (:mod:`experiments.configs.dro_fl_byzantine`): on
this machine AFL's 2,000 rounds take two to six minutes a run.
"""

from experiments import configs
from experiments.configs import dro_fl_byzantine, natural_dro, natural_dro_femnist

WRITERS = 105
ALGORITHMS = {name: natural_dro.METHODS[name] for name in ("fedavg", "feddro", "afl")}
RULES = {
  "none": None,
  "median": {"rule": "coordinate_median"},
  "trimmed": {"rule": "trimmed_mean", "beta": 0.2},
  "krum": {"rule": "krum", "f": 21},
  "mkrum": {"rule": "multi_krum", "f": 21, "m": 84},
  "cclip": {"rule": "centered_clipping", "tau": 0.1, "iterations": 3},
}


def get_config():
  config = natural_dro_femnist.get_config()
  config.seeds = (0,)
  config.methods = configs.methods(
    dro_fl_byzantine.methods(
      (0.1, 0.2),
      algorithms=ALGORITHMS,
      rules=RULES,
      clients=WRITERS,
      inflate=(0.2,),
      label_flip=(0.2,),
    )
  )
  return config
