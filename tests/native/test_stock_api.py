"""``import etmlx.native`` registers EtMlxBackend with ExecuTorch's C++ runtime, after
which ExecuTorch's own Python API runs etmlx programs unchanged."""

import pytest
import torch

import etmlx
import etmlx.native
from examples import models


@pytest.fixture(scope="module")
def encoder_block(tmp_path_factory):
    module, inputs, dynamic_shapes = models.encoder_block_dynamic_seq()
    path = tmp_path_factory.mktemp("native") / "encoder_block.pte"
    etmlx.export(module, inputs, path, dynamic_shapes=dynamic_shapes)
    return module.eval(), path


def test_backend_is_registered_under_the_id_export_writes():
    from executorch.runtime import Runtime

    from etmlx.lowering.preprocess import EtMlxBackend
    from etmlx.serializer import BACKEND_ID

    assert EtMlxBackend.__name__ == BACKEND_ID  # ExecuTorch files payloads under the class name
    registry = Runtime.get().backend_registry
    assert BACKEND_ID in registry.registered_backend_names
    assert registry.is_available(BACKEND_ID)


def test_stock_api_runs_an_etmlx_program_at_several_lengths(encoder_block):
    from executorch.runtime import Runtime

    module, path = encoder_block
    method = Runtime.get().load_program(path).load_method("forward")
    for seq in (2, 9, 40):  # the output is resized to each length
        tokens = torch.randint(0, 256, (2, seq))
        (output,) = method.execute([tokens])
        with torch.no_grad():
            torch.testing.assert_close(output, module(tokens), rtol=1e-5, atol=1e-5)


def test_stock_api_rejects_inputs_beyond_the_exported_bounds(encoder_block):
    from executorch.runtime import Runtime

    _, path = encoder_block
    method = Runtime.get().load_program(path).load_method("forward")
    with pytest.raises(RuntimeError):
        method.execute([torch.randint(0, 256, (2, 4000))])
    with pytest.raises(RuntimeError):
        method.execute([torch.randn(2, 8)])  # float tokens
    (output,) = method.execute([torch.randint(0, 256, (2, 5))])  # still usable
    assert output.shape == (2, 5, 64)


def test_native_and_python_runtimes_implement_the_same_operations():
    """Every IR operation has a handler in both runtimes, and nothing else does."""
    from etmlx.runtime_shim.mlx_ops import handled_operations
    from etmlx.serializer.ir import schema_operations

    assert handled_operations() == schema_operations(), "Python runtime vs schema"
    assert etmlx.native.operations() == schema_operations(), "native runtime vs schema"


def test_native_reads_the_format_version_the_writer_writes():
    from etmlx.serializer import FORMAT_VERSION

    assert etmlx.native.format_version() == FORMAT_VERSION


def test_unknown_runtime_is_named():
    with pytest.raises(ValueError, match="unknown runtime 'metal'; choose one of python, executorch"):
        etmlx.load(b"", runtime="metal")
