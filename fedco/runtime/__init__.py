"""The federated simulator: vmapped clients, scanned steps and rounds, one jit per chunk."""

from fedco.runtime.simulator import (
    client_mesh,
    Ledger,
    NonFiniteError,
    SimState,
    SimulationResult,
    Simulator,
    draw_batch,
    oracle_args,
    simulate)

__all__ = [
    "client_mesh",     "Ledger", "NonFiniteError", "SimState", "SimulationResult", "Simulator", "draw_batch",
    "oracle_args", "simulate",
]
