"""The federated simulator: vmapped clients, scanned steps and rounds, one jit per chunk."""

from fedco.runtime import distributed, host
from fedco.runtime.host import (CsvWriter, Interrupted, JsonlWriter, MetricWriter,
                                PeriodicAction, TensorBoardWriter)
from fedco.runtime.batching import draw_batch, oracle_args
from fedco.runtime.ledger import Ledger
from fedco.runtime.loop import NonFiniteError, SimulationResult, simulate
from fedco.runtime.simulator import SimState, Simulator, client_mesh
from fedco.runtime.sweep import SweepResult, sweep

__all__ = [
    "Ledger", "NonFiniteError", "SimState", "SimulationResult", "Simulator", "client_mesh",
    "distributed", "host", "CsvWriter", "Interrupted", "JsonlWriter", "MetricWriter",
    "PeriodicAction", "TensorBoardWriter", "draw_batch", "oracle_args", "simulate",
    "SweepResult", "sweep",
]
