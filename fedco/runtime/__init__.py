"""The federated simulator: vmapped clients, scanned steps and rounds, one jit per chunk."""

from fedco.runtime import distributed, host
from fedco.runtime.batching import ClientView, draw, draw_batch, oracle_args
from fedco.runtime.host import (
  CsvWriter,
  Interrupted,
  JsonlWriter,
  RoundAction,
  RowWriter,
  TensorBoardWriter,
  interrupt_guard,
)
from fedco.runtime.ledger import Ledger
from fedco.runtime.loop import NonFiniteError, SimulationResult, simulate
from fedco.runtime.mesh import CLIENTS, client_mesh
from fedco.runtime.rounds import SimState
from fedco.runtime.simulator import Simulator
from fedco.runtime.sweep import PerSeed, SweepResult, sweep

__all__ = [
  "CLIENTS",
  "ClientView",
  "draw",
  "Ledger",
  "NonFiniteError",
  "SimState",
  "SimulationResult",
  "Simulator",
  "client_mesh",
  "distributed",
  "host",
  "CsvWriter",
  "Interrupted",
  "JsonlWriter",
  "RowWriter",
  "RoundAction",
  "TensorBoardWriter",
  "interrupt_guard",
  "draw_batch",
  "oracle_args",
  "simulate",
  "PerSeed",
  "SweepResult",
  "sweep",
]
