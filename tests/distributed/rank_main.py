"""One rank of tensor-parallel programs, as ``mlx.launch -n N`` starts it (the tests'
entry point): ``rank_main.py RUNTIME OUT JOB...``, each JOB ``NAME:MODE:DIRECTORY``, run in
order in this one process, where MODE is

- ``forward``: runs ``forward`` on the arrays of ``OUT/NAME.npz``;
- ``generate``: greedy generation (``examples/generate_tensor_parallel.py``) from the prompt
  and token count in ``OUT/NAME.npz`` (prefill, then decode), keeping every call's logits;
- ``stall`` / ``die``: as ``forward``, but rank 1 stops answering first (sleeps; exits).

Each rank writes a job's outputs to ``OUT/NAME.rank<r>.npz``.
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import etmlx  # noqa: E402
from examples.generate_tensor_parallel import greedy  # noqa: E402


def forward(program, inputs) -> dict:
    return {f"out{i}": np.asarray(out) for i, out in enumerate(program.run_method("forward", inputs))}


def run(runtime, out, name, mode, directory) -> None:
    program = etmlx.load(directory, runtime=runtime)
    rank = program.rank
    with np.load(os.path.join(out, f"{name}.npz")) as archive:
        inputs = {key: archive[key] for key in archive.files}
    if mode == "generate":
        tokens, logits = greedy(program, inputs["prompt"].tolist(), int(inputs["new_tokens"]))
        results = {"tokens": np.array(tokens), "logits": logits}
    else:
        if rank == 1 and mode == "stall":
            time.sleep(600)
        if rank == 1 and mode == "die":
            os._exit(3)
        results = forward(program, [inputs[key] for key in sorted(inputs)])
    np.savez(os.path.join(out, f"{name}.rank{rank}.npz"), **results)


def main(runtime, out, *jobs) -> None:
    for job in jobs:
        run(runtime, out, *job.split(":", 2))


if __name__ == "__main__":
    main(*sys.argv[1:])
