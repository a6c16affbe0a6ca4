"""The federated simulator: vmapped clients, scanned steps and rounds, one jit per chunk."""

from fedco.runtime import distributed, host
from fedco.runtime.host import (CsvWriter, Interrupted, JsonlWriter, MetricWriter,
                                TensorBoardWriter)
from fedco.runtime.simulator import (Ledger, NonFiniteError, SimState, SimulationResult, Simulator,
                                     client_mesh, draw_batch, oracle_args, simulate)
from fedco.runtime.sweep import SweepResult, sweep

__all__ = [
    "Ledger", "NonFiniteError", "SimState", "SimulationResult", "Simulator", "client_mesh",
    "distributed", "host", "CsvWriter", "Interrupted", "JsonlWriter", "MetricWriter",
    "TensorBoardWriter", "draw_batch", "oracle_args", "simulate", "SweepResult", "sweep",
]
