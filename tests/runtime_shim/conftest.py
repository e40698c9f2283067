"""Shared helpers: export small models to .pte with plain ExecuTorch."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # shim_fake_backend, shim_aot_backend


def export_pte(module, args, dynamic_shapes=None, config=None, partitioner=None) -> bytes:
    import torch
    from executorch.exir import to_edge, to_edge_transform_and_lower

    ep = torch.export.export(module.eval(), args, dynamic_shapes=dynamic_shapes)
    if partitioner is not None:
        edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    else:
        edge = to_edge(ep)
    return edge.to_executorch(config).buffer if config else edge.to_executorch().buffer


@pytest.fixture(scope="session")
def export():
    return export_pte
