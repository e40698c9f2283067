"""One rank of tensor-parallel programs, as ``mlx.launch -n N`` starts it (the tests'
entry point): ``rank_main.py RUNTIME OUT JOB...``, each JOB ``NAME:MODE:DIRECTORY``, run in
order in this one process, where MODE is

- ``forward``: runs ``forward`` on the arrays of ``OUT/NAME.npz``;
- ``generate``: greedy generation from the prompt in ``OUT/NAME.npz`` (prefill, then
  decode), keeping every call's logits;
- ``stall`` / ``die``: as ``forward``, but rank 1 stops answering first (sleeps; exits).

Each rank writes a job's outputs to ``OUT/NAME.rank<r>.npz``.
"""

import os
import sys
import time

import numpy as np

import etmlx


def forward(program, inputs) -> dict:
    return {f"out{i}": np.asarray(out) for i, out in enumerate(program.run_method("forward", inputs))}


def generate(program, prompt: np.ndarray, new_tokens: int, capacity: int) -> dict:
    from etmlx import causal_lm

    tokens = [int(t) for t in prompt]
    logits = program.run_method(
        "prefill", [np.array([tokens]), np.arange(len(tokens)), causal_lm.window(len(tokens), capacity)]
    )[0]
    steps = [np.asarray(logits)[0, -1]]
    while True:
        tokens.append(int(np.argmax(steps[-1])))
        if len(tokens) == len(prompt) + new_tokens:
            break
        position = len(tokens) - 1
        logits = program.run_method(
            "decode", [np.array([[tokens[-1]]]), np.array([position]), causal_lm.window(position + 1, capacity)]
        )[0]
        steps.append(np.asarray(logits)[0, -1])
    return {"tokens": np.array(tokens), "logits": np.stack(steps)}


def run(runtime, out, name, mode, directory) -> None:
    program = etmlx.load(directory, runtime=runtime)
    rank = program.rank
    with np.load(os.path.join(out, f"{name}.npz")) as archive:
        inputs = {key: archive[key] for key in archive.files}
    if mode == "generate":
        results = generate(program, inputs["prompt"], int(inputs["new_tokens"]), int(inputs["capacity"]))
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
