"""The fuzzer: mutates exported .pte files (random damage, and structured edits of the
etmlx payloads resealed with valid checksums), loads and runs each mutant on the
chosen runtimes in a child process, and reports how many ran, raised a documented
error, raised anything else, crashed the process or hung. A language model of the
corpus also has a saved prompt (etmlx.llm.prompt_cache): every other round mutates that
instead and restores it into the program before the call.

    python fuzz/run.py --cases 10000 [--seed 0] [--runtimes python,executorch]
    make fuzz                                  # the same, 10,000 cases

A case that crashes, hangs or raises an undocumented error is saved under
``build/fuzz/findings`` with what was done to it, so it can be replayed with
``etmlx.load``. Exit status 1 when there is any.
"""

import argparse
import collections
import json
import os
import pathlib
import random
import select
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fuzz import corpus, mutate, mutate_prompt_cache  # noqa: E402

WORK = ROOT / "build" / "fuzz"
CASES_PER_WORKER = 400  # a fresh child now and then keeps memory flat


class Worker:
    """A child process running cases; restarted after a crash or a hang."""

    def __init__(self, runtimes: list):
        self.runtimes = runtimes
        self.process = None
        self.ran = 0

    def _start(self):
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "fuzz" / "worker.py"), *self.runtimes],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        os.set_blocking(self.process.stderr.fileno(), False)
        self.ran = 0

    def run(self, case: dict, timeout: float) -> dict:
        if self.process is None or self.ran >= CASES_PER_WORKER:
            self.stop()
            self._start()
        self.ran += 1
        self.process.stdin.write(json.dumps(case) + "\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, left))
            if ready:
                line = self.process.stdout.readline()
                if line:
                    return json.loads(line)
                return self._lost("crashed")
            if left <= 0:
                return self._lost("hung")

    def _lost(self, outcome: str) -> dict:
        self.process.kill()
        self.process.wait()
        stderr = self.process.stderr.read() or ""
        self.process = None
        return {"outcome": outcome, "message": stderr[-2000:]}

    def stop(self):
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait()
            self.process = None


def fuzz(cases: int, seed: int, runtimes: list, timeout: float, work: pathlib.Path = WORK, report=print):
    """Runs ``cases`` mutants, keeping the corpus, the case in flight and any findings
    under ``work``; returns the count of each outcome (ran, raised, undocumented,
    crashed, hung)."""
    import numpy as np

    entries = corpus.build(work / "corpus")
    inputs = {}
    for entry in entries:
        inputs[entry.name] = work / f"{entry.name}.inputs.npz"
        np.savez(inputs[entry.name], *entry.inputs)
    findings = work / "findings"
    worker, counts = Worker(runtimes), collections.Counter()
    case_path, saved_path = work / "case.pte", work / "case.kv"
    try:
        for index in range(cases):
            entry = entries[index % len(entries)]
            runtime = runtimes[(index // len(entries)) % len(runtimes)]
            rng = random.Random(f"{seed}:{index}")
            case = {"id": index, "path": str(case_path), "runtime": runtime, "method": entry.method,
                    "inputs": str(inputs[entry.name])}
            round_ = index // (len(entries) * len(runtimes))
            if entry.prompt_cache and round_ % 2:  # every other round: its saved prompt
                data, what = mutate_prompt_cache.mutate(entry.prompt_cache, rng)
                case_path.write_bytes(entry.pte)
                saved_path.write_bytes(data)
                case["prompt_cache"] = str(saved_path)
            else:
                data, what = mutate.mutate(entry.pte, rng)
                case_path.write_bytes(data)
            result = worker.run(case, timeout)
            outcome = result["outcome"]
            if outcome == "raised" and not result["documented"]:
                outcome = "undocumented"
            counts[outcome] += 1
            if outcome in ("crashed", "hung", "undocumented"):
                findings.mkdir(parents=True, exist_ok=True)
                name = f"{entry.name}-{runtime}-{seed}-{index}"
                (findings / f"{name}{'.kv' if 'prompt_cache' in case else '.pte'}").write_bytes(data)
                detail = f"{what}\n{result.get('type', '')} {result.get('message', '')}"
                (findings / f"{name}.txt").write_text(detail)
                report(f"case {index} ({entry.name}, {runtime}) {outcome}: {what}\n    {detail.splitlines()[-1][:300]}")
    finally:
        worker.stop()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runtimes", default="python,executorch")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as hung")
    args = parser.parse_args()
    started = time.monotonic()
    counts = fuzz(args.cases, args.seed, args.runtimes.split(","), args.timeout)
    seconds = time.monotonic() - started
    print(f"{args.cases} cases (seed {args.seed}, runtimes {args.runtimes}) in {seconds:.0f} s: "
          + ", ".join(f"{counts[k]} {k}" for k in ("ran", "raised", "undocumented", "crashed", "hung")))
    return 1 if counts["undocumented"] or counts["crashed"] or counts["hung"] else 0


if __name__ == "__main__":
    sys.exit(main())
