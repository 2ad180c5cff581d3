#!/usr/bin/env python3
"""bankml_convert's command line with a stage clock installed: where a conversion's time goes.

    python3 oracle/stage_times.py FILE ARGS...      (oracle/bench.py runs bankml this way)

runs `bankml_convert.py ARGS...` compiled from its source (as a script run compiles it; but a script
run also keeps its parse tree for the whole run, which this does not, so its peak RSS is lower than a
user's: `make bench` measures memory from plain script runs) and appends one JSON line to FILE per
conversion -- per stage its
wall time and the CPU time of the main thread and of the other threads (the inputs' hasher, the
flusher), and each worker's CPU time and peak RSS -- so `make bench` can show whether the workers
or the serial hashing set the pace.  The product only offers the hook (bankml_convert.stage_clock).
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bankml_convert.py"


class StageClock:
    """Laps of wall, main-thread CPU and other-threads CPU time, and the workers' rusage."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows: list[dict] = []
        self.workers: list[dict] = []
        self.before_cpu_s = time.process_time()     # startup, imports, reading headers, the tensor plan
        self._mark()

    def _mark(self) -> None:
        self._wall, self._thread, self._process = time.perf_counter(), time.thread_time(), time.process_time()

    def lap(self, stage: str) -> None:
        thread, process = time.thread_time() - self._thread, time.process_time() - self._process
        self.rows.append({"stage": stage, "wall_s": time.perf_counter() - self._wall, "cpu_s": thread,
                          "threads_cpu_s": max(process - thread, 0.0)})
        self._mark()

    def worker(self, usage) -> None:
        self.workers.append({"cpu_s": usage.ru_utime + usage.ru_stime, "max_rss_kib": usage.ru_maxrss})

    def write(self, size: int) -> None:
        line = json.dumps({"before_cpu_s": self.before_cpu_s, "stages": self.rows, "workers": self.workers,
                           "output_bytes": size})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def main() -> int:
    path, args = sys.argv[1], sys.argv[2:]
    # The module is made from its source under its own name (so its __main__ block does not run), the
    # clock installed, then its main called as that block calls it.
    code = compile(SCRIPT.read_bytes(), str(SCRIPT), "exec")
    module = types.ModuleType("bankml_convert")
    module.__file__ = str(SCRIPT)
    sys.modules["bankml_convert"] = module
    exec(code, module.__dict__)
    del code
    module.stage_clock = lambda: StageClock(path)
    sys.argv = [str(SCRIPT), *args]
    return module._exit(module.main(args))


if __name__ == "__main__":
    sys.exit(main())
