"""The ``("clients",)`` device mesh and the helpers that lay a client axis along it."""

from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np

from fedco import _validate

PyTree = Any
#: The name of the device-mesh axis that clients are laid along.
CLIENTS = "clients"


def client_mesh(num_devices: Optional[int] = None) -> jax.sharding.Mesh:
  """A one-axis ``("clients",)`` mesh over the first ``num_devices`` devices.

  Pass it as ``mesh=`` to :func:`fedco.simulate` / :class:`fedco.Simulator`, which lay each
  round's clients along it (a client count the mesh does not divide is padded with masked
  clients; results equal the one-device run up to float round-off: the sums over clients
  are split across devices), or to :func:`fedco.sweep`, which lays whole
  runs along it. In a multi-process run (:mod:`fedco.runtime.distributed`) the devices are
  those of every process.

  Args:
    num_devices: how many of ``jax.devices()`` to use, an int in ``[1, jax.device_count()]``;
      ``None`` (default) uses them all.

  Returns:
    A ``jax.sharding.Mesh`` with the single axis ``"clients"`` (:data:`CLIENTS`).

  Raises:
    ValueError: if ``num_devices`` is not an int in ``[1, jax.device_count()]``.

  Examples:
    >>> import jax
    >>> import fedco
    >>> mesh = fedco.runtime.client_mesh(1)
    >>> mesh.axis_names, dict(mesh.shape)
    (('clients',), {'clients': 1})
    >>> fedco.runtime.client_mesh().size == jax.device_count()
    True
  """
  available = jax.device_count()
  num = (
    available
    if num_devices is None
    else _validate.positive_int(
      "num_devices", num_devices, maximum=available, note="the devices present"
    )
  )
  return jax.sharding.Mesh(np.array(jax.devices()[:num]), (CLIENTS,))


def check_mesh(mesh) -> Optional[jax.sharding.Mesh]:
  """``mesh`` if it is ``None`` or a mesh with a ``"clients"`` axis, else a ``ValueError``."""
  if mesh is not None and (
    not isinstance(mesh, jax.sharding.Mesh) or CLIENTS not in mesh.axis_names
  ):
    raise ValueError(
      f"mesh must be a jax.sharding.Mesh with a {CLIENTS!r} axis (see "
      f"fedco.runtime.client_mesh), got {mesh!r}"
    )
  return mesh


def replicated(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  """Every device of ``mesh`` holds the whole array."""
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def place(tree: PyTree, mesh: Optional[jax.sharding.Mesh]) -> PyTree:
  """Lay the leading (client-slot) axis of every leaf along the mesh's clients axis (inside a
  traced program; nothing without a mesh)."""
  if mesh is None:
    return tree
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(CLIENTS))
  return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, sharding), tree)


def client_vmap(fn, mesh: Optional[jax.sharding.Mesh], in_axes=0):
  """``vmap`` over client slots, laid along the mesh's clients axis when there is one."""
  return jax.vmap(fn, in_axes=in_axes, spmd_axis_name=None if mesh is None else CLIENTS)
