"""A run's identity: what makes two runs the same (its checkpoint folder), and the digests
of code and arrays it is made of."""

from __future__ import annotations

import hashlib
import inspect
import os
from typing import Any, Dict, Mapping, Optional

import jax
import numpy as np

import fedco
from fedco.experiment import outputs
from fedco.experiment.config_methods import Method


def identity(
  base: Mapping[str, Any], method: Method, seed: int, schedule: Mapping[str, Any]
) -> Dict[str, Any]:
  """What defines one run: ``base`` (the config's run-defining fields, the digest of the
  run's data and initial model and of the experiment module's source), the method's
  settings and its algorithm's source digest (:func:`code_digest`), the seed and the
  schedule."""
  code = code_digest(fedco.ALGORITHMS.get(method.algorithm))
  method_id = {**method.settings(), **({"source_sha256": code} if code else {})}
  return {**base, **schedule, "method": method_id, "seed": seed}


def code_digest(obj) -> Optional[str]:
  """The SHA-256 of the source file defining ``obj`` (a module, a factory) when it lies
  outside fedco: editing your experiment module or your algorithm then starts its runs
  afresh instead of resuming checkpoints of the old code. ``None`` for fedco's own code
  (an upgrade keeps resuming; the checkpoints' fingerprints guard it) or none on disk."""
  try:
    path = inspect.getsourcefile(inspect.unwrap(obj))
  except (TypeError, ValueError):  # built in, or defined in place: no file
    return None
  if not path or not os.path.isfile(path):
    return None
  inside = os.path.join(os.path.realpath(os.path.dirname(fedco.__file__)), "")
  return None if os.path.realpath(path).startswith(inside) else outputs.file_digest(path)


def digest(tree) -> str:
  """The SHA-256 of a pytree's arrays (shapes, dtypes and bytes, in leaf order)."""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    array = np.asarray(leaf)
    h.update(f"{array.dtype}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
  return h.hexdigest()
