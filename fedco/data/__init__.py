"""Federated data: the container, loaders, partitioners and the federated set.

* :class:`FederatedData`: one examples pytree plus each client's slice of one sorted row
  list (memory ``O(total examples)``); :class:`ClientBlockData`, the multi-process layout.
* Sources (host NumPy ``{"x": float32, "y": int32}``): :func:`load`, :func:`load_tfds`
  (``tfds.data_source``, no TensorFlow), :func:`load_digits` (scikit-learn, offline),
  :func:`load_npz` (your own arrays in an ``.npz`` file).
* Partitioners (seeded, one index array per client): :func:`iid`, :func:`quantity_skew`,
  :func:`dirichlet_label_skew`, :func:`dominant_class`, :func:`matched_validation`.
* :class:`FederatedDataset` and :func:`make_federated`: training and validation clients
  plus the central test split.
* UCI Adult for the fairness experiment: :func:`load_adult`, :func:`federated_adult`.
* Step-imbalanced CIFAR10-ST / CIFAR100-ST (E5): :func:`load_st`, :func:`step_imbalance`.
* Few-shot Omniglot episodes (E4): :func:`load_omniglot` and the module :mod:`.omniglot`.
"""

from fedco.data import omniglot, sinusoid
from fedco.data.adult import AdultData, federated_adult, load_adult, proxy_groups, resample_proxies
from fedco.data.blocks import ClientBlockData
from fedco.data.datasets import FederatedDataset, make_federated
from fedco.data.federated import FederatedData
from fedco.data.imbalanced import load_st, step_imbalance
from fedco.data.omniglot import load_omniglot
from fedco.data.partition import (
  dirichlet_label_skew,
  dominant_class,
  dominant_class_counts,
  iid,
  matched_validation,
  quantity_skew,
)
from fedco.data.sources import (
  DATASETS,
  NUM_CLASSES,
  Splits,
  load,
  load_digits,
  load_npz,
  load_tfds,
  num_classes,
)

__all__ = [
  "ClientBlockData",
  "FederatedData",
  "FederatedDataset",
  "make_federated",
  "iid",
  "quantity_skew",
  "dirichlet_label_skew",
  "dominant_class",
  "dominant_class_counts",
  "matched_validation",
  "DATASETS",
  "NUM_CLASSES",
  "Splits",
  "load",
  "load_digits",
  "load_npz",
  "load_tfds",
  "num_classes",
  "sinusoid",
  "omniglot",
  "load_omniglot",
  "load_st",
  "step_imbalance",
  "AdultData",
  "federated_adult",
  "load_adult",
  "proxy_groups",
  "resample_proxies",
]
