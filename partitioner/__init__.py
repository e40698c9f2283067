"""Which nodes MLX takes, decided by the lowering rules' own checks."""

from .partitioner import MlxPartitioner
from .report import PartitionReport

__all__ = ["MlxPartitioner", "PartitionReport"]
