"""An export traces and lowers with Python's cyclic collector started less often
(``pipeline.fewer_collections``), and leaves the caller's thresholds as they were, also
when it fails."""

import gc

import executorch.exir
import pytest
import torch

import etmlx
from etmlx.pipeline import EXPORT_COLLECTION_THRESHOLD


def _recorded(function, seen: list):
    def recording(*args, **kwargs):
        seen.append(gc.get_threshold())
        return function(*args, **kwargs)
    return recording


def test_the_collector_runs_less_often_while_exporting_and_as_the_caller_set_it_after(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(torch.export, "export", _recorded(torch.export.export, seen))
    monkeypatch.setattr(executorch.exir, "to_edge", _recorded(executorch.exir.to_edge, seen))
    before = gc.get_threshold()
    gc.set_threshold(1234, 5, 6)
    try:
        etmlx.export(torch.nn.Linear(3, 2), (torch.randn(3),), tmp_path / "m.pte")
        assert seen == [(EXPORT_COLLECTION_THRESHOLD, 5, 6)] * 2  # the trace, the edge program
        assert gc.get_threshold() == (1234, 5, 6)
        with pytest.raises(etmlx.ExportError):
            etmlx.export(torch.nn.Linear(3, 2), (torch.randn(4),), tmp_path / "n.pte")
        assert gc.get_threshold() == (1234, 5, 6)
    finally:
        gc.set_threshold(*before)
