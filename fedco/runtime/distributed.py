"""Multi-process (multi-host) runs in which each process holds only its own clients' data.

A multi-controller JAX program runs the *same* script on every process (one per host, or
several on one host); ``jax.distributed.initialize`` joins them into one set of global
devices, and every ``jax.jit`` call is then one SPMD program over all of them. fedco's
simulator is already one program whose client axis is laid along a ``("clients",)`` mesh
(:func:`fedco.runtime.client_mesh`, ``Simulator(mesh=...)``); this module adds what is needed
when that mesh spans processes:

1. :func:`initialize` checks its arguments, selects gloo for cross-process CPU collectives
   (jax's default in 0.10, set explicitly) and calls ``jax.distributed.initialize``.
2. **Ownership** (:func:`client_layout`, :func:`process_clients`): with ``K`` clients and
   ``D`` positions on the mesh's clients axis, position ``i`` holds the ``c = ceil(K / D)``
   consecutive clients ``[i c, (i + 1) c)``; ids ``>= K`` are *padding blocks* (no client).
   A process owns the clients of the positions whose devices it holds; with
   :func:`client_mesh` (devices in ``jax.devices()`` order, grouped by process) that is one
   contiguous range of ids per process. The rule needs only ``K`` and the mesh, so every
   process computes every other's share without communicating.
3. **Data** (:func:`global_data`): every process passes *only its own clients'* example
   pytrees. The result is a :class:`ClientBlockData`, a :class:`~fedco.data.FederatedData`
   in *client-block layout*: ``examples`` has ``B * max_n`` rows (``B = c D`` blocks of
   ``max_n`` rows, ``max_n`` the largest client) and client ``k``'s examples are rows
   ``[k max_n, k max_n + n_k)`` (padded by repeating its first example; padding blocks repeat
   the process's first example). ``examples`` is one global ``jax.Array`` sharded over the
   clients axis, built with ``jax.make_array_from_callback``, whose callback runs only for
   this process's devices and reads only this process's clients. The counts, offsets and
   flat evaluation list are metadata (derived from the client sizes) and are replicated.
   Sizes are exchanged with one small ``multihost_utils.process_allgather`` (or passed as
   ``client_sizes``), together with a checksum of the example structure, shapes and dtypes.
4. **Simulator**: given a :class:`ClientBlockData`, the simulator keeps the examples where
   they are (no replicated ``device_put``) and runs in *resident* mode: a round has one slot
   per block, slot ``i`` is client ``i`` and reads its own block (a batched gather along the
   sharded axis, local to the device), and with partial participation the unsampled clients'
   slots are masked (weight 0, writes dropped) instead of moving sampled clients' data to
   other devices. Randomness is folded from client ids, so results equal a one-process run
   up to float32 summation order. Evaluation runs over the block rows (padding rows have
   owner ``K`` and weight 0); only per-client sums cross devices.
5. **Results** (:func:`fetch`): ``simulate`` returns global arrays; :func:`fetch` brings any
   pytree to host numpy on every process (replicated arrays are read locally, sharded ones
   with ``process_allgather``; every process must call it on the same arrays).

Launch (on every host, with its own ``PROCESS_ID``)::

  from fedco.runtime import distributed
  distributed.initialize("host0:1234", num_processes=2, process_id=PROCESS_ID)
  mesh = fedco.runtime.client_mesh()                       # all global devices
  mine = distributed.process_clients(K, mesh)              # this process's client ids
  data = distributed.global_data([load_client(k) for k in mine], K, mesh)
  result = fedco.simulate(problem, algorithm, data, x0, rounds=R, mesh=mesh)
  params = distributed.fetch(result.params)                # on every process
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np

from fedco.data.blocks import ClientBlockData
from fedco.runtime.mesh import CLIENTS, client_mesh

PyTree = Any


def _check_int(name, value, low, high=None):
  if (
    isinstance(value, bool)
    or not isinstance(value, (int, np.integer))
    or value < low
    or (high is not None and value > high)
  ):
    bounds = f"[{low}, {high}]" if high is not None else f">= {low}"
    raise ValueError(f"{name} must be an integer in {bounds}, got {value!r}")
  return int(value)


def initialize(
  coordinator_address: str,
  num_processes: int,
  process_id: int,
  *,
  local_device_count: Optional[int] = None,
  initialization_timeout: int = 300,
) -> None:
  """Join this process to a multi-process JAX run (call before any other JAX work).

  Args:
    coordinator_address: ``"host:port"`` of process 0 (every process passes the same).
    num_processes: how many processes take part.
    process_id: this process's id in ``[0, num_processes)``.
    local_device_count: on CPU, how many devices this process exposes (sets
      ``jax_num_cpu_devices``; ``None`` keeps jax's default or ``XLA_FLAGS``).
    initialization_timeout: seconds to wait for every process to join.

  Raises:
    ValueError: a malformed argument (named in the message).
    RuntimeError: JAX's backend was already initialised in this process.
  """
  if not isinstance(coordinator_address, str) or coordinator_address.count(":") < 1:
    raise ValueError(
      f"coordinator_address must be a 'host:port' string, got {coordinator_address!r}"
    )
  host, _, port = coordinator_address.rpartition(":")
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(
      f"coordinator_address must be a 'host:port' string with a port in "
      f"[1, 65535], got {coordinator_address!r}"
    )
  num_processes = _check_int("num_processes", num_processes, 1)
  process_id = _check_int("process_id", process_id, 0, num_processes - 1)
  _check_int("initialization_timeout", initialization_timeout, 1)
  if local_device_count is not None:
    local_device_count = _check_int("local_device_count", local_device_count, 1)
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top

  if getattr(xla_bridge, "backends_are_initialized", lambda: False)():
    raise RuntimeError(
      "fedco.runtime.distributed.initialize must run before any JAX "
      "computation or device query in this process"
    )
  if local_device_count is not None:
    jax.config.update("jax_num_cpu_devices", local_device_count)
  # Cross-process collectives on CPU need an implementation; gloo ships with jaxlib.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
    coordinator_address, num_processes, process_id, initialization_timeout=initialization_timeout
  )


def _default_mesh(mesh):
  if mesh is None:
    return client_mesh()
  if not isinstance(mesh, jax.sharding.Mesh) or CLIENTS not in mesh.axis_names:
    raise ValueError(
      f"mesh must be a jax.sharding.Mesh with a {CLIENTS!r} axis (see "
      f"fedco.runtime.client_mesh), got {mesh!r}"
    )
  return mesh


def _position_owners(mesh) -> List[int]:
  """The process holding each position of the clients axis (all its devices must agree)."""
  axis = mesh.axis_names.index(CLIENTS)
  devices = np.moveaxis(mesh.devices, axis, 0).reshape(mesh.shape[CLIENTS], -1)
  owners = []
  for i, row in enumerate(devices):
    procs = {d.process_index for d in row}
    if len(procs) != 1:
      raise ValueError(
        f"position {i} of the mesh's {CLIENTS!r} axis spans processes "
        f"{sorted(procs)}; every device replicating a block of clients must "
        "belong to one process"
      )
    owners.append(procs.pop())
  return owners


def client_layout(num_clients: int, mesh: Optional[jax.sharding.Mesh] = None):
  """``(clients_per_position, num_blocks, owner_of_block)`` for ``num_clients`` on ``mesh``.

  Position ``i`` of the clients axis holds blocks ``[i c, (i + 1) c)``, ``c = ceil(K / D)``;
  ``owner_of_block[j]`` is the process index holding block ``j`` (blocks ``>= K`` pad).
  """
  num_clients = _check_int("num_clients", num_clients, 1)
  mesh = _default_mesh(mesh)
  d = mesh.shape[CLIENTS]
  c = math.ceil(num_clients / d)
  owners = _position_owners(mesh)
  return c, c * d, [owners[j // c] for j in range(c * d)]


def process_clients(
  num_clients: int, mesh: Optional[jax.sharding.Mesh] = None, process_index: Optional[int] = None
) -> List[int]:
  """The client ids process ``process_index`` (default: this one) holds, ascending.

  See the module docstring for the rule; with :func:`fedco.runtime.client_mesh` the ids form
  one contiguous range. A process may own none when ``K`` is small.
  """
  _, _, owners = client_layout(num_clients, mesh)
  p = (
    jax.process_index()
    if process_index is None
    else _check_int("process_index", process_index, 0, jax.process_count() - 1)
  )
  return [k for k, o in enumerate(owners[:num_clients]) if o == p]


def _spec_checksum(structure, leaves) -> int:
  text = repr(
    (str(structure), [(tuple(np.shape(l)[1:]), str(np.asarray(l).dtype)) for l in leaves])
  )
  return zlib.crc32(text.encode()) & 0x7FFFFFFF


def _local_clients(local_clients, mine) -> Dict[int, Any]:
  """``{client id: examples}`` of this process's clients ``mine``, from a sequence in their
  order or a mapping over exactly them."""
  if isinstance(local_clients, Mapping):
    if sorted(local_clients) != mine:
      raise ValueError(
        f"local_clients must hold exactly this process's clients {mine} (see "
        f"process_clients), got ids {sorted(local_clients)}"
      )
    return {int(k): local_clients[k] for k in mine}
  if len(local_clients) != len(mine):
    raise ValueError(
      f"local_clients must hold this process's {len(mine)} clients {mine} "
      f"(see process_clients), got {len(local_clients)}"
    )
  return dict(zip(mine, local_clients))


def _host_leaves(local, first_id):
  """``(structure, {client id: [leaf arrays]})``, every client checked against the first
  (one structure, a leading example axis of one non-zero size, trailing shapes and dtypes)."""
  first = local[first_id]
  structure = jax.tree.structure(first)
  ref = [np.asarray(l) for l in jax.tree.leaves(first)]
  host = {}
  for k, ex in local.items():
    if jax.tree.structure(ex) != structure:
      raise ValueError(
        f"client {k}'s examples have structure {jax.tree.structure(ex)}, expected {structure}"
      )
    leaves = [np.asarray(l) for l in jax.tree.leaves(ex)]
    if not leaves or any(l.ndim == 0 for l in leaves):
      raise ValueError(f"client {k}'s examples need leaves with a leading example axis")
    sizes = {l.shape[0] for l in leaves}
    if len(sizes) != 1 or 0 in sizes:
      raise ValueError(
        f"client {k}'s example leaves need one non-zero leading size, got "
        f"shapes {[l.shape for l in leaves]}"
      )
    for a, b in zip(leaves, ref):
      if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
        raise ValueError(
          f"client {k}'s example leaf {a.shape[1:]} {a.dtype} differs from "
          f"client {first_id}'s {b.shape[1:]} {b.dtype}"
        )
    host[k] = leaves
  return structure, host


def global_data(
  local_clients,
  num_clients: int,
  mesh: Optional[jax.sharding.Mesh] = None,
  *,
  client_sizes: Optional[Sequence[int]] = None,
) -> ClientBlockData:
  """Federated data whose examples are sharded over ``mesh`` from each process's own clients.

  Every process calls this with the same ``num_clients`` and ``mesh`` (it is collective when
  sizes are exchanged). The examples of other processes' clients are never read, passed or
  materialised here: each device's shard is built from this process's arrays only.

  Args:
    local_clients: this process's clients' example pytrees, either a sequence in the order
      of :func:`process_clients` or a mapping ``{client_id: pytree}`` over exactly those ids.
      Leaves have a leading example axis; every client (in every process) has the same
      structure, trailing shapes and dtypes.
    num_clients: ``K``, the number of clients over all processes.
    mesh: the mesh the simulator will run on (default :func:`fedco.runtime.client_mesh`).
    client_sizes: every client's example count (``K`` ints), if every process knows them;
      otherwise they are exchanged with one ``process_allgather`` of ``B + 1`` integers.

  Returns:
    A :class:`ClientBlockData` (pass it to ``Simulator``/``simulate`` with the same mesh).

  Raises:
    ValueError: wrong client ids or count, an empty client, inconsistent structures, shapes
      or dtypes (also across processes), or ``client_sizes`` that disagree with the data.
  """
  mesh = _default_mesh(mesh)
  num_clients = _check_int("num_clients", num_clients, 1)
  c, num_blocks, owners = client_layout(num_clients, mesh)
  me = jax.process_index()
  mine = [k for k, o in enumerate(owners[:num_clients]) if o == me]
  local = _local_clients(local_clients, mine)
  if not local:
    raise ValueError(
      f"process {me} owns no clients ({num_clients} clients over "
      f"{mesh.shape[CLIENTS]} mesh positions); use fewer devices or more "
      "clients so every process holds at least one"
    )
  structure, host = _host_leaves(local, mine[0])
  checksum = _spec_checksum(structure, host[mine[0]])
  local_counts = np.zeros(num_blocks + 1, np.int64)
  for k, leaves in host.items():
    local_counts[k] = leaves[0].shape[0]
  local_counts[num_blocks] = checksum
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    gathered = np.asarray(multihost_utils.process_allgather(local_counts.astype(np.int32)))
  else:
    gathered = local_counts[None].astype(np.int32)
  if len(set(gathered[:, num_blocks].tolist())) != 1:
    raise ValueError(
      "processes disagree on the examples' structure, trailing shapes or "
      f"dtypes (checksums {gathered[:, num_blocks].tolist()})"
    )
  counts = gathered[:, :num_clients].sum(axis=0).astype(np.int64)
  if client_sizes is not None:
    given = np.asarray(client_sizes, np.int64).reshape(-1)
    if given.shape != (num_clients,) or np.any(given[mine] != counts[mine]):
      raise ValueError(
        f"client_sizes must list the {num_clients} clients' example counts; "
        f"this process's clients {mine} have {counts[mine].tolist()}, "
        f"client_sizes says {np.asarray(client_sizes).tolist()}"
      )
  if np.any(counts < 1):
    raise ValueError(f"every client needs at least one example; counts {counts.tolist()}")
  max_n = int(counts.max())

  def block(j, leaf):
    """Block ``j`` (``max_n`` rows) of leaf ``leaf``, from this process's data only."""
    if j < num_clients:
      if j not in host:  # the layout guarantees this never happens
        raise AssertionError(
          f"process {me} asked for client {j}'s rows, owned by process {owners[j]}"
        )
      a = host[j][leaf]
      pad = np.repeat(a[:1], max_n - a.shape[0], axis=0)
      return np.concatenate([a, pad])
    return np.repeat(host[mine[0]][leaf][:1], max_n, axis=0)

  rows = num_blocks * max_n
  ref = host[mine[0]]
  arrays = []
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(CLIENTS))
  for leaf, a in enumerate(ref):

    def callback(index, leaf=leaf):
      start, stop, _ = index[0].indices(rows)
      if start % max_n or stop % max_n:
        raise AssertionError(f"shard rows {start}:{stop} are not block-aligned")
      out = np.concatenate([block(j, leaf) for j in range(start // max_n, stop // max_n)])
      return out[(slice(None),) + tuple(index[1:])]

    arrays.append(jax.make_array_from_callback((rows,) + a.shape[1:], sharding, callback))
  examples = jax.tree.unflatten(structure, arrays)

  owner = np.full((num_blocks, max_n), num_clients, np.int32)
  for k in range(num_clients):
    owner[k, : counts[k]] = k
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  offsets = np.arange(num_clients, dtype=np.int32) * max_n  # client k's block starts here
  meta: Tuple[jax.Array, jax.Array, jax.Array, jax.Array] = jax.device_put(
    (counts.astype(np.int32), offsets, np.arange(rows, dtype=np.int32), owner.reshape(-1)),
    replicated,
  )
  return ClientBlockData(examples, *meta, max_count=max_n)


def fetch(tree: PyTree) -> PyTree:
  """Host numpy copies of a pytree's arrays, on every process.

  Fully addressable arrays are read as ``jax.device_get`` does; replicated global arrays
  from a local copy; sharded global arrays with ``multihost_utils.process_allgather`` (a
  collective: every process must call ``fetch`` on the same arrays in the same order).
  """

  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return jax.device_get(x)
    if x.sharding.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

  return jax.tree.map(one, tree)
