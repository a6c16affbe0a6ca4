"""E1 with Byzantine clients (issue 48): FedAvg, FedDRO and AFL under each aggregation rule.

``python -m experiments.main --config=experiments/configs/dro_fl_byzantine.py
--workdir=runs/e1-byzantine``. E1's ten quantity-skewed clients (one of 500 digits, nine of
20); 0, 1 or 2 of them Byzantine (``fractions``), the same clients all run
(``fedco.byzantine.attack``'s ``seed``). Two attacks:

* ``"flip"``: every upload sign-flipped (the models' changes, FedDRO's ``y`` and AFL's
  loss reports alike);
* ``"inflate"``: only the DRO methods' loss channel, ``scale`` times their honest report
  (FedDRO's ``y``, AFL's ``loss``): what captures loss-based client weights.

Each rule (``rules``: ``none`` is the weighted mean the methods use without
``aggregation=``) at each fraction; ``0`` shows what a rule costs where nobody attacks. The
method labels read ``<algorithm>_<rule>_<attack>_<Byzantine clients>``. 3 methods x 6 rules
x (1 + 2 attacks x 2 fractions, inflate for FedDRO and AFL only) = 78 runs a seed.
"""

from experiments import configs
from experiments.configs import dro_fl

ALGORITHMS = {
  "fedavg": {"algorithm": "fedavg", "weighting": "samples"},
  "feddro": {"algorithm": "feddro", "beta": 0.5},
  "afl": {"algorithm": "afl", "weights_lr": 0.1},
}
# The rules at E1's ten clients: Krum tolerates f = 2 (n > 2f + 2); Multi-Krum averages
# the n - f best; the trimmed mean drops 2 of 10 at each end.
RULES = {
  "none": None,
  "median": {"rule": "coordinate_median"},
  "trimmed": {"rule": "trimmed_mean", "beta": 0.2},
  "krum": {"rule": "krum", "f": 2},
  "mkrum": {"rule": "multi_krum", "f": 2, "m": 8},
  "cclip": {"rule": "centered_clipping", "tau": 1.0, "iterations": 3},
}
REPORTS = {"feddro": "y", "afl": "loss"}


def methods(
  fractions=(0.1, 0.2),
  inflate_scale=10.0,
  *,
  algorithms=None,
  rules=None,
  clients=10,
  gaussian=(),
  inflate=None,
  label_flip=(),
):
  """Every (algorithm, rule, attack, fraction) of the grid as a ``config.methods`` entry.

  ``algorithms``/``rules``: name -> entry (defaults: this module's ``ALGORITHMS`` and
  ``RULES``); ``clients``: ``K``, for the labels' counts; ``gaussian``: the fractions at which
  clients also send Gaussian noise (``fedco.byzantine.attack``'s ``"gaussian"``, scale 1);
  ``inflate``: the fractions of the DRO methods' inflated reports (default ``fractions``);
  ``label_flip``: the fractions at which clients train honestly on flipped labels
  (``byzantine.kind: "label_flip"``, :func:`fedco.byzantine.flip_labels`).
  """
  algorithms = ALGORITHMS if algorithms is None else algorithms
  rules = RULES if rules is None else rules
  inflate = fractions if inflate is None else inflate
  out = {}
  for name, entry in algorithms.items():
    for rule_name, rule in rules.items():
      base = {**entry, **({"aggregation": rule} if rule else {})}
      out[f"{name}_{rule_name}_clean_0"] = base
      for kind, chosen in (("flip", fractions), ("gaussian", gaussian), ("labels", label_flip)):
        for fraction in chosen:
          label = f"{name}_{rule_name}_{kind}_{round(fraction * clients)}"
          out[label] = {
            **base,
            "byzantine": {"fraction": fraction, "kind": _KINDS[kind]},
          }
      report = REPORTS.get(entry["algorithm"])
      for fraction in inflate if report else ():
        out[f"{name}_{rule_name}_inflate_{round(fraction * clients)}"] = {
          **base,
          "byzantine": {
            "fraction": fraction,
            "kind": "scale",
            "scale": inflate_scale,
            "fields": (report,),
          },
        }
  return out


_KINDS = {"flip": "sign_flip", "gaussian": "gaussian", "labels": "label_flip"}


def get_config():
  config = dro_fl.get_config()
  config.methods = configs.methods(methods())
  return config
