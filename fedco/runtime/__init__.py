"""The federated simulator: vmapped clients, scanned steps and rounds, one jit per chunk."""

from fedco.runtime.simulator import (Ledger, SimState, SimulationResult, Simulator, draw_batch,
                                     oracle_args, simulate)

__all__ = ["Ledger", "SimState", "SimulationResult", "Simulator", "draw_batch", "oracle_args",
           "simulate"]
