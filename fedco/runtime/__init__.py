"""The federated simulator: vmapped clients, scanned steps and rounds, one jit per chunk."""

from fedco.runtime import distributed
from fedco.runtime.simulator import (Ledger, NonFiniteError, SimState, SimulationResult, Simulator,
                                     client_mesh, draw_batch, oracle_args, simulate)
from fedco.runtime.sweep import SweepResult, sweep

__all__ = [
    "Ledger", "NonFiniteError", "SimState", "SimulationResult", "Simulator", "client_mesh",
    "distributed", "draw_batch", "oracle_args", "simulate", "SweepResult", "sweep",
]
