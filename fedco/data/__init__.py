"""Federated data: the container, loaders, partitioners and the federated data set.

The simulator takes one :class:`~fedco.FederatedData`: every example stored once (a pytree of
arrays with a leading example axis) and each client ``k`` a slice of one sorted row list, so
clients of 50,000 and 1 examples cost ``O(total examples)`` memory, not ``K x largest``. It
is a pytree; pass it to jitted code. :class:`ClientBlockData` is the same data in
client-block layout for multi-device and multi-process runs (made by
:func:`fedco.runtime.distributed.global_data`).

A typical pipeline loads host splits, partitions them, and builds the clients::

  train, test = fedco.data.load("digits")                  # offline
  train_parts = fedco.data.quantity_skew(train["y"], 10, big=500, small=20, seed=0)
  val_parts = fedco.data.matched_validation(train_parts, train["y"], test["y"], seed=0)
  fed = fedco.data.make_federated(train, test, train_parts, val_parts, "digits", 10)
  fedco.simulate(..., data=fed.train, ...)

* **Containers**: :class:`~fedco.FederatedData` (``from_clients``, ``from_index_lists``),
  :class:`ClientBlockData`, and :class:`FederatedDataset` with :func:`make_federated`
  (training and validation clients plus the central test split).
* **Sources** (host NumPy ``{"x": float32, "y": int32}`` in :class:`Splits`): :func:`load`,
  :func:`load_tfds`, :func:`load_digits`, :func:`load_npz`, :func:`num_classes`,
  :data:`DATASETS`, :data:`NUM_CLASSES`.
* **Partitioners** (seeded, one sorted index array per client, every client non-empty):
  :func:`iid`, :func:`quantity_skew` (SPEC E1), :func:`dirichlet_label_skew`,
  :func:`dominant_class` and :func:`dominant_class_counts` (SPEC E2), and
  :func:`matched_validation` (per-client validation sets from the test split, SPEC E1).
* **UCI Adult** for the fairness experiments (SPEC 4.6, E1b, E6): :func:`load_adult`,
  :class:`AdultData`, :func:`proxy_groups`, :func:`resample_proxies`,
  :func:`federated_adult`.
* **Step-imbalanced** CIFAR10-ST / CIFAR100-ST (SPEC E5): :func:`load_st`,
  :func:`step_imbalance`.
* **Natural partitions** (one client per user, with each user's own held-out examples):
  LEAF's JSON files, :func:`load_leaf` (FEMNIST, Shakespeare, Sent140, Synthetic; also
  :func:`read_leaf`, :func:`write_leaf`); FedJAX's SQLite client files, :func:`load_sqlite`
  (EMNIST-62, Shakespeare, CIFAR-100; :func:`read_clients`, :func:`write_clients`); TFDS
  records grouped by a feature, :func:`load_tfds_clients`; TensorFlow Federated's HDF5
  client files, :func:`read_h5_clients`, and its Shakespeare preprocessed as TFF does it
  (every role kept), :func:`load_shakespeare_tff` with :func:`shakespeare_accuracy`
  (module :mod:`fedco.data.tff`); FedProx's Synthetic(alpha,
  beta), :func:`synthetic` and :func:`synthetic_users` (offline); all through
  :func:`from_users`.
* **Meta-learning episodes**: few-shot Omniglot (SPEC E4), :func:`load_omniglot` and the
  module :mod:`fedco.data.omniglot`; sinusoid regression tasks (SPEC E3), the module
  :mod:`fedco.data.sinusoid`.

What works offline and what needs data on disk (fedco never downloads anything):

* **Offline**: :func:`synthetic` (LEAF / FedProx Synthetic(alpha, beta)), :func:`load_digits` and ``load("digits")`` / ``load_st("digits")``
  (scikit-learn's 1797 8x8 digits, bundled with scikit-learn), :mod:`fedco.data.sinusoid`
  (synthetic), :func:`load_npz` (your own arrays in an ``.npz`` file), and every
  partitioner and container (plain arrays).
* **TFDS, prepared beforehand**: :func:`load_tfds`, ``load``/``load_st`` of ``mnist``,
  ``fashion_mnist``, ``cifar10``, ``cifar100``, and :func:`load_omniglot` read with
  ``tfds.data_source(..., download=False)`` (no TensorFlow at run time). Prepare each data
  set once, on a machine with network and TensorFlow, with ``tfds build <name>
  --file_format=array_record``, and pass the folder as ``data_dir`` (or set
  ``TFDS_DATA_DIR``); :mod:`fedco.data.sources` has the details. A data set that is missing
  raises ``FileNotFoundError`` with that advice. In tests, ``tfds.testing.mock_data`` stands
  in for the files.
* **TFF's Shakespeare**: the project's copy in ``../shared/data/shakespeare_tff`` next to a
  source checkout, or the two ``.h5`` files TFF downloads (:mod:`fedco.data.tff`).
* **LEAF and FedJAX files**, prepared once with network (LEAF's ``preprocess.sh``,
  FedJAX's download addresses): :mod:`fedco.data.leaf` and :mod:`fedco.data.sqlite` give
  the commands.
* **Adult files**: :func:`load_adult` reads ``adult.data`` and ``adult.test`` from a folder
  (the UCI files; no copy ships in the package); ``data_dir=None`` is the project's shared
  copy next to a source checkout.
"""

from fedco.data import image_folder, omniglot, sinusoid, tff
from fedco.data.adult import AdultData, federated_adult, load_adult, proxy_groups, resample_proxies
from fedco.data.blocks import ClientBlockData
from fedco.data.datasets import FederatedDataset, make_federated
from fedco.data.federated import FederatedData
from fedco.data.image_folder import load_image_folder
from fedco.data.imbalanced import load_st, step_imbalance
from fedco.data.leaf import (
  LEAF_DATASETS,
  LETTERS,
  load_leaf,
  read_leaf,
  synthetic,
  synthetic_users,
  write_leaf,
)
from fedco.data.natural import from_users, load_tfds_clients
from fedco.data.omniglot import load_omniglot, load_omniglot_zips
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
from fedco.data.sqlite import SQLITE_DATASETS, load_sqlite, read_clients, write_clients
from fedco.data.store import ClientStore, write_store
from fedco.data.tff import (
  load_shakespeare_tff,
  read_h5_clients,
  shakespeare_accuracy,
  shakespeare_loss,
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
  "tff",
  "image_folder",
  "load_image_folder",
  "load_omniglot",
  "load_omniglot_zips",
  "load_st",
  "step_imbalance",
  "AdultData",
  "federated_adult",
  "load_adult",
  "proxy_groups",
  "resample_proxies",
  "from_users",
  "load_tfds_clients",
  "LEAF_DATASETS",
  "LETTERS",
  "read_leaf",
  "write_leaf",
  "load_leaf",
  "synthetic_users",
  "synthetic",
  "SQLITE_DATASETS",
  "read_clients",
  "write_clients",
  "load_sqlite",
  "read_h5_clients",
  "load_shakespeare_tff",
  "shakespeare_accuracy",
  "shakespeare_loss",
  "ClientStore",
  "write_store",
]
