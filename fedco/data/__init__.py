"""Federated data: the index-table container (loaders and partitioners build on it)."""

from fedco.data.federated import FederatedData

__all__ = ["FederatedData"]
