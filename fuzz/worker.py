"""The fuzzer's child process: loads and runs one case at a time and reports each
outcome on its own line, so that when a case crashes or hangs the process, the parent
knows which one it was.

Reads JSON lines ``{"id", "path", "runtime", "method", "inputs"}`` (and ``"prompt_cache"``:
a saved prompt restored before the call) on stdin; writes
``{"id", "outcome": "ran" | "raised", "type", "documented", "message"}`` lines on the
stdout it started with (anything else printed goes to stderr).
"""

import json
import os
import sys

import numpy as np

import etmlx
from etmlx.llm import prompt_cache
from etmlx.runtime_shim import errors

# The errors etmlx documents for a malformed program or bad input (etmlx/errors.py and
# runtime_shim/errors.py); anything else escaping a load or a call is a bug.
DOCUMENTED = (
    errors.PteFormatError,
    errors.InputError,
    errors.CapacityError,
    errors.BackendError,
    errors.ExecutionError,
    errors.OperatorError,
    errors.IndexRangeError,
    errors.NoSuchMethodError,
    etmlx.EtMlxError,
)


def run_case(case: dict) -> dict:
    with np.load(case["inputs"]) as archive:
        inputs = [archive[f"arr_{i}"] for i in range(len(archive.files))]
    try:
        program = etmlx.load(case["path"], runtime=case["runtime"])
        if "prompt_cache" in case:
            prompt_cache.restore(program, case["prompt_cache"])
        program.run_method(case["method"], inputs)
        return {"outcome": "ran"}
    except Exception as error:  # classified, not swallowed: the parent reports undocumented ones
        return {
            "outcome": "raised",
            "type": type(error).__name__,
            "documented": isinstance(error, DOCUMENTED) and bool(str(error).strip()),
            "message": str(error)[:400],
        }


def main() -> None:
    results = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not look like results
    if "executorch" in sys.argv[1:]:
        import etmlx.native  # noqa: F401  (registers the backend once, up front)
    for line in sys.stdin:
        case = json.loads(line)
        results.write(json.dumps({"id": case["id"], **run_case(case)}) + "\n")


if __name__ == "__main__":
    main()
