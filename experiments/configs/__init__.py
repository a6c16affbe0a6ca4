"""Experiment configs in the flax examples' convention: one ``ml_collections`` file per
experiment (and one per variant, importing its experiment's file) with ``get_config()``,
run by ``python -m experiments.main --config=<file>``."""

import ml_collections
from ml_collections import config_dict


def methods(entries) -> ml_collections.ConfigDict:
  """``config.methods`` from ``{label: {"algorithm": name, argument: value, ...}}``.

  Every entry gets ``learning_rate`` and ``local_steps`` as typed placeholders where it does
  not set them (the shared ``config.learning_rate`` / ``config.local_steps`` then apply), so
  ``--config.methods.<label>.learning_rate=0.05`` overrides any method from the command
  line.
  """
  out = {}
  for label, entry in dict(entries).items():
    entry = dict(entry)
    for key, kind in (("learning_rate", float), ("local_steps", int)):
      if entry.get(key) is None:  # unset (or an unset placeholder's to_dict())
        entry[key] = config_dict.placeholder(kind)
    out[label] = entry
  return ml_collections.ConfigDict(out)
