r"""TensorFlow Federated's HDF5 client data, and Shakespeare preprocessed as TFF does it.

TFF publishes its simulation data sets (``tff.simulation.datasets``: Shakespeare, EMNIST,
StackOverflow, ...) as HDF5 files read by ``HDF5ClientData``: one group per client under
``examples``, each holding one dataset per feature, all with one row per example::

  /examples/<client_id>/<feature>    e.g. /examples/ALL_S_WELL_THAT_ENDS_WELL_ADAM/snippets

:func:`read_h5_clients` reads any such file with ``h5py`` (no TensorFlow). The project's
copy of Shakespeare (715 speaking roles, 16,068 training and 2,356 held-out snippets) lies
in ``<repository>/../shared/data/shakespeare_tff`` next to a source checkout; elsewhere,
``tff.simulation.datasets.shakespeare.load_data()`` downloads the same two files once into
``~/.keras/datasets`` (``shakespeare_train.h5``, ``shakespeare_test.h5``).

:func:`load_shakespeare_tff` preprocesses Shakespeare as TFF's baselines
(``tff.simulation.baselines.shakespeare``, used by Reddi et al. 2021) do, with the same
vocabulary as FedJAX, so every client is kept however short its snippets (decision 99):

* **Ids** (:data:`NUM_CLASSES` = 90): :data:`PAD` = 0; the 86 characters of
  :data:`SHAKESPEARE_VOCAB` are ``1 .. 86`` in that string's order (byte ``c`` is
  ``SHAKESPEARE_VOCAB.index(c) + 1``); any other byte is :data:`OOV` = 87; :data:`BOS` = 88
  and :data:`EOS` = 89 begin and end every snippet.
* **Sequences**: each snippet's bytes become ``[BOS, ids..., EOS]``, padded with ``PAD`` to
  a multiple of ``sequence_length + 1`` and cut into rows of ``sequence_length + 1``; a
  row ``s`` gives the example ``x = s[:-1]``, ``y = s[1:]`` (``int32 [sequence_length]``
  each). A snippet of ``L`` bytes gives ``ceil((L + 2) / (sequence_length + 1))`` examples,
  an empty one one example, so no client is lost.
* **Accuracy** (:func:`shakespeare_accuracy`) counts only targets that are characters of
  the vocabulary: pad, OOV, BOS and EOS targets are left out, as TFF's
  ``MaskedCategoricalAccuracy`` and FedJAX's Shakespeare metrics leave them out.

FedJAX numbers the same vocabulary differently (PAD 0, BOS 1, EOS 2, characters 3-88,
OOV 89) and joins a client's snippets before cutting; the classes are the same 90, so
masked accuracies compare (decision 99).
"""

from __future__ import annotations

import os
from typing import Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

from fedco import _validate
from fedco.data.datasets import FederatedDataset
from fedco.data.natural import from_users

#: TFF's and FedJAX's Shakespeare characters (the TFF text-generation tutorial's
#: vocabulary); the character at index ``i`` has id ``i + 1``.
SHAKESPEARE_VOCAB = (
  "dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]!%)-159\r"
)
#: Padding after a snippet's end (and the id of no character).
PAD = 0
#: Any byte outside :data:`SHAKESPEARE_VOCAB`.
OOV = len(SHAKESPEARE_VOCAB) + 1
#: Begin-of-snippet.
BOS = len(SHAKESPEARE_VOCAB) + 2
#: End-of-snippet.
EOS = len(SHAKESPEARE_VOCAB) + 3
#: Ids ``0 .. NUM_CLASSES - 1``: pad, the 86 characters, OOV, BOS, EOS.
NUM_CLASSES = len(SHAKESPEARE_VOCAB) + 4
#: McMahan et al. 2017's sequence length, TFF's and FedJAX's default.
SEQUENCE_LENGTH = 80
#: The file names TFF gives Shakespeare's two splits.
SHAKESPEARE_FILES = ("shakespeare_train.h5", "shakespeare_test.h5")
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The project's copy, next to a source checkout.
DEFAULT_DATA_DIR = os.path.join(_REPO_ROOT, "..", "shared", "data", "shakespeare_tff")

_TABLE = np.full(256, OOV, np.int32)
_TABLE[list(SHAKESPEARE_VOCAB.encode("ascii"))] = np.arange(1, len(SHAKESPEARE_VOCAB) + 1)

__all__ = [
  "SHAKESPEARE_VOCAB",
  "PAD",
  "OOV",
  "BOS",
  "EOS",
  "NUM_CLASSES",
  "SEQUENCE_LENGTH",
  "read_h5_clients",
  "shakespeare_sequences",
  "load_shakespeare_tff",
  "shakespeare_accuracy",
  "shakespeare_loss",
  "shakespeare_scored",
]


def _h5_file(path: str):
  """The file open for reading, after one-line refusals of folders, absent and non-HDF5 files."""
  import h5py  # lazily: import fedco stays fast

  if os.path.isdir(path):
    raise ValueError(f"path {path!r} is a folder, not a TFF HDF5 client file (.h5)")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"path {path!r} does not exist (a TFF HDF5 client file, .h5)")
  try:
    is_hdf5 = h5py.is_hdf5(path)
  except OSError as e:
    raise ValueError(f"{path}: cannot read the file ({e})") from None
  if not is_hdf5:
    raise ValueError(f"{path}: not an HDF5 file (TFF's client data is HDF5, read with h5py)")
  try:
    return h5py.File(path, "r")
  except OSError as e:
    raise ValueError(f"{path}: a damaged HDF5 file ({e})") from None


def _client(path: str, group, client: str) -> Dict[str, np.ndarray]:
  import h5py

  if not isinstance(group, h5py.Group):
    raise ValueError(f"{path}: examples/{client} is not a group of features (a client's group)")
  features: Dict[str, np.ndarray] = {}
  try:
    for name, item in group.items():
      if not isinstance(item, h5py.Dataset):
        raise ValueError(
          f"{path}: client {client!r}: its feature {name!r} is a group, not an array"
        )
      features[name] = item[()]
  except (OSError, RuntimeError, KeyError) as e:
    raise ValueError(f"{path}: client {client!r}: its features cannot be read ({e})") from None
  if not features:
    raise ValueError(f"{path}: client {client!r} has no features (an empty group)")
  sizes = {name: (len(a) if np.ndim(a) else 0) for name, a in features.items()}
  if len(set(sizes.values())) != 1 or 0 in {np.ndim(a) for a in features.values()}:
    raise ValueError(
      f"{path}: client {client!r}: its features must have one row per example each; "
      f"they have {sizes} rows"
    )
  return features


def read_h5_clients(
  path, client_ids: Optional[Sequence[str]] = None
) -> Iterator[Tuple[str, Dict[str, np.ndarray]]]:
  """Each client's features from a TFF HDF5 client file, one client at a time.

  Args:
    path: a TFF ``.h5`` file (``examples/<client_id>/<feature>``).
    client_ids: read only these clients (``str`` ids, in this order); ``None``: all, in
      the file's order (h5py's: sorted by id for TFF's files, as TFF lists them).

  Returns:
    An iterator of ``(client_id, {feature: array})``, the arrays as h5py reads them (byte
    strings as ``bytes`` arrays, fixed-length or object), all with one row per example.

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: ``path`` is a folder, not an HDF5 file (or a damaged one), has no
      ``examples`` group, a client has no features or features with different numbers of
      rows, or ``client_ids`` names a client the file lacks; the message names the file
      (and client).

  Examples:
    A file written in TFF's layout with h5py, then read back:

    >>> import os, tempfile
    >>> import h5py
    >>> import fedco
    >>> path = os.path.join(tempfile.mkdtemp(), "train.h5")
    >>> with h5py.File(path, "w") as f:
    ...   _ = f.create_dataset("examples/ROMEO/snippets", data=[b"But soft!", b"What light"])
    >>> [(cid, x["snippets"].tolist()) for cid, x in fedco.data.read_h5_clients(path)]
    [('ROMEO', [b'But soft!', b'What light'])]
  """
  import h5py

  path = os.fspath(path)
  with _h5_file(path) as f:
    examples = f.get("examples")
    if not isinstance(examples, h5py.Group):
      raise ValueError(
        f"{path}: no 'examples' group (TFF's layout is examples/<client_id>/<feature>); the "
        f"file holds {sorted(f.keys())}"
      )
    try:
      ids = list(examples.keys()) if client_ids is None else [str(c) for c in client_ids]
    except (OSError, RuntimeError) as e:
      raise ValueError(f"{path}: its client list cannot be read ({e})") from None
    for client in ids:
      if client not in examples:
        raise ValueError(f"{path}: client_ids names {client!r}, which the file does not hold")
      yield client, _client(path, examples[client], client)


def shakespeare_sequences(
  snippets, sequence_length: int = SEQUENCE_LENGTH
) -> Dict[str, np.ndarray]:
  """One client's snippets as next-character examples, as TFF's baselines make them.

  Each snippet (bytes, or ``str`` encoded as UTF-8) becomes ``[BOS, ids..., EOS]``, padded
  with :data:`PAD` to a multiple of ``sequence_length + 1`` and cut into rows ``s`` of that
  length; each row is an example ``x = s[:-1]``, ``y = s[1:]``.

  Args:
    snippets: a client's snippets (a 1-D array or list of byte strings).
    sequence_length: the length of ``x`` and ``y`` (80, McMahan et al.'s).

  Returns:
    ``{"x": int32 [n, sequence_length], "y": int32 [n, sequence_length]}``, ``n >= 1`` per
    snippet.

  Examples:
    ``b"Ay"`` with ``sequence_length=3``: ``[BOS, A, y, EOS]`` is one row of 4 ("A" is
    character 70 of the vocabulary, id 71; "y" is 69, id 70):

    >>> from fedco.data import tff
    >>> ex = tff.shakespeare_sequences([b"Ay"], sequence_length=3)
    >>> ex["x"].tolist(), ex["y"].tolist(), (tff.BOS, tff.EOS)
    ([[88, 71, 70]], [[71, 70, 89]], (88, 89))
  """
  sequence_length = _validate.positive_int("sequence_length", sequence_length)
  row = sequence_length + 1
  rows = []
  for snippet in np.asarray(snippets, dtype=object).reshape(-1):
    data = snippet.encode("utf-8") if isinstance(snippet, str) else bytes(snippet)
    tokens = np.full(-(-(len(data) + 2) // row) * row, PAD, np.int32)
    tokens[0] = BOS
    tokens[1 : len(data) + 1] = _TABLE[np.frombuffer(data, np.uint8)]
    tokens[len(data) + 1] = EOS
    rows.append(tokens.reshape(-1, row))
  seqs = np.concatenate(rows) if rows else np.zeros((0, row), np.int32)
  return {"x": seqs[:, :-1], "y": seqs[:, 1:]}


def _paths(data_dir, train_path, test_path) -> Tuple[str, str]:
  if data_dir is not None and (train_path is not None or test_path is not None):
    raise ValueError("give data_dir, or train_path and test_path, not both")
  if data_dir is None and (train_path is None) != (test_path is None):
    raise ValueError("train_path and test_path go together: give both (or data_dir)")
  if train_path is not None:
    return os.fspath(train_path), os.fspath(test_path)
  data_dir = DEFAULT_DATA_DIR if data_dir is None else os.fspath(data_dir)
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(
      f"data_dir {data_dir!r} is not a folder (one holding {' and '.join(SHAKESPEARE_FILES)}, "
      "as tff.simulation.datasets.shakespeare.load_data() downloads them)"
    )
  return tuple(os.path.join(data_dir, f) for f in SHAKESPEARE_FILES)  # type: ignore[return-value]


def _client_sequences(path: str, client: str, examples, sequence_length: int):
  if "snippets" not in examples:
    raise ValueError(
      f"{path}: client {client!r} has the features {sorted(examples)}, not 'snippets': is it "
      "TFF's Shakespeare?"
    )
  snippets = np.asarray(examples["snippets"])
  if snippets.ndim != 1 or snippets.dtype.kind not in "SO":
    raise ValueError(
      f"{path}: client {client!r}: snippets must be a 1-D array of byte strings, got "
      f"{snippets.dtype} of shape {snippets.shape}"
    )
  try:
    return shakespeare_sequences(snippets, sequence_length)
  except TypeError:  # an object array holding something other than bytes
    raise ValueError(f"{path}: client {client!r}: snippets must be byte strings") from None


def load_shakespeare_tff(
  data_dir=None,
  *,
  train_path=None,
  test_path=None,
  sequence_length: int = SEQUENCE_LENGTH,
  max_clients: Optional[int] = None,
) -> FederatedDataset:
  """TFF's Shakespeare, one client per speaking role, preprocessed as TFF does it.

  Every client's snippets become next-character examples (:func:`shakespeare_sequences`):
  ``x`` and ``y`` ``int32 [n, sequence_length]``, ``y`` the next id at each position, with
  :data:`NUM_CLASSES` classes; every role with snippets in both files is a client (all
  715 of TFF's), its held-out snippets its validation set.

  Args:
    data_dir: a folder holding ``shakespeare_train.h5`` and ``shakespeare_test.h5``;
      ``None`` (with no paths) is the project's copy, ``<repo>/../shared/data/shakespeare_tff``.
    train_path: instead of ``data_dir``: the training ``.h5`` file.
    test_path: with ``train_path``: the held-out ``.h5`` file with the same client ids.
    sequence_length: the example length (80, TFF's and FedJAX's).
    max_clients: keep only the first this many training clients (``None``: all).

  Returns:
    A :class:`~fedco.data.FederatedDataset` (``sequence_labels``: ``y`` is a row of
    targets per example); ``info["users"]`` holds the role ids, ``info`` also the
    vocabulary's special ids.

  Raises:
    FileNotFoundError: a folder or file does not exist.
    ValueError: bad arguments, or a damaged file (see :func:`read_h5_clients`) or a client
      without byte-string ``snippets``.

  Examples:
    Two roles written in TFF's layout; Adam's held-out snippet is short and still kept:

    >>> import os, tempfile
    >>> import h5py
    >>> import fedco
    >>> root = tempfile.mkdtemp()
    >>> text = {"train": [b"Yes, my good lord."], "test": [b"Ay."]}
    >>> for split in ("train", "test"):
    ...   with h5py.File(os.path.join(root, f"shakespeare_{split}.h5"), "w") as f:
    ...     for role in ("ADAM", "EVE"):
    ...       _ = f.create_dataset(f"examples/{role}/snippets", data=text[split])
    >>> fed = fedco.data.load_shakespeare_tff(root)
    >>> fed.info["users"], fed.num_classes, fed.train.examples["x"].shape
    (['ADAM', 'EVE'], 90, (2, 80))
  """
  sequence_length = _validate.positive_int("sequence_length", sequence_length)
  if max_clients is not None:
    max_clients = _validate.positive_int("max_clients", max_clients)
  train_path, test_path = _paths(data_dir, train_path, test_path)
  train: Dict[str, Dict[str, np.ndarray]] = {}
  for client, examples in read_h5_clients(train_path):
    if max_clients is not None and len(train) == max_clients:
      break
    train[client] = _client_sequences(train_path, client, examples, sequence_length)
  with _h5_file(test_path) as f:  # the held-out file's ids, to read only the kept clients
    held = f.get("examples")
    ids = [c for c in train if held is not None and c in held]
  test = {
    client: _client_sequences(test_path, client, examples, sequence_length)
    for client, examples in read_h5_clients(test_path, ids if held is not None else None)
  }
  info = {
    "source": "tff_hdf5",
    "train_path": train_path,
    "test_path": test_path,
    "sequence_length": sequence_length,
    "pad": PAD,
    "oov": OOV,
    "bos": BOS,
    "eos": EOS,
  }
  return from_users(
    train, test, name="shakespeare", num_classes=NUM_CLASSES, info=info, sequence_labels=True
  )


def shakespeare_accuracy(logits, y):
  """Accuracy on one example's sequence, leaving out pad, OOV, BOS and EOS targets.

  The house accuracy for sequences (``logits`` of ONE example, as fedco's models take one
  example): the fraction of targets that are characters of :data:`SHAKESPEARE_VOCAB` and
  that the largest logit predicts, TFF's ``MaskedCategoricalAccuracy(masked_tokens=[pad,
  oov, bos, eos])`` for one example. An example whose targets are all left out has accuracy
  0, and its weight (the count of scored targets, :func:`shakespeare_scored`) is 0, so
  ``sum(accuracy * scored) / sum(scored)`` over examples is TFF's pooled accuracy.

  Args:
    logits: ``float [sequence_length, NUM_CLASSES]`` (jax or NumPy).
    y: ``int [sequence_length]`` target ids.

  Returns:
    A float32 scalar: correct scored targets over scored targets (0 where none is scored).

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco.data import tff
    >>> y = jnp.array([5, 7, tff.EOS, tff.PAD])
    >>> logits = jax.nn.one_hot(jnp.array([5, 8, tff.EOS, tff.PAD]), tff.NUM_CLASSES)
    >>> float(tff.shakespeare_accuracy(logits, y))  # 1 of the 2 characters
    0.5
    >>> float(tff.shakespeare_accuracy(logits[2:], y[2:]))  # nothing scored
    0.0
  """
  from fedco.models.sequence import masked_accuracy  # pylint: disable=import-outside-toplevel

  return masked_accuracy(logits, y, shakespeare_scored(y))


def shakespeare_loss(logits, y):
  """One example's sequence loss: the mean token cross-entropy over its non-pad targets.

  The training loss of TFF's and FedJAX's Shakespeare models (padding masked, OOV, BOS and
  EOS kept as targets), for ``logits`` of ONE example as fedco's models take one example:
  :func:`fedco.models.masked_cross_entropy` with the mask ``y != PAD``. The twin of
  :func:`shakespeare_accuracy`.

  Args:
    logits: ``float [sequence_length, NUM_CLASSES]``.
    y: ``int [sequence_length]`` target ids.

  Returns:
    A float scalar (0 where every target is padding).

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco.data import tff
    >>> y = jnp.array([5, tff.EOS, tff.PAD])
    >>> logits = jnp.zeros((3, tff.NUM_CLASSES))  # uniform: log(90) per kept target
    >>> round(float(tff.shakespeare_loss(logits, y)), 4)
    4.4998
  """
  from fedco.models.sequence import masked_cross_entropy  # pylint: disable=import-outside-toplevel

  return masked_cross_entropy(logits, y, y != PAD)


def shakespeare_scored(y):
  """``bool`` mask of the targets accuracy counts: characters, not pad, OOV, BOS or EOS.

  Args:
    y: integer target ids of any shape (NumPy or jax).

  Returns:
    A ``bool`` array of ``y``'s shape.

  Examples:
    >>> import numpy as np
    >>> from fedco.data import tff
    >>> tff.shakespeare_scored(np.array([tff.PAD, 1, tff.OOV, 86, tff.BOS, tff.EOS])).tolist()
    [False, True, False, True, False, False]
  """
  y = np.asarray(y) if isinstance(y, (list, tuple)) else y
  return (y != PAD) & (y < OOV)
