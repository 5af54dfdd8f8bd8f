"""Shared measuring helpers for the scripts/bench_*.py benchmarks."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

# Runs a Python command line and records the process's own peak RSS (VmHWM) at exit, and
# optionally a JSON result. (ru_maxrss would not do: Linux keeps it across exec, so a child
# forked from a large benchmark process inherits that process's peak.)
_WRAPPER = """
import atexit, runpy, sys
out = sys.argv.pop(1)
def record():
    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))
    open(out, 'w').write(hwm.split()[1])
atexit.register(record)
sys.argv = sys.argv[1:]
if sys.argv[0] == '-c':
    code = sys.argv.pop(1)  # the rest, as for `python -c code args`: sys.argv = ['-c', args...]
    exec(compile(code, '<bench>', 'exec'), {'__name__': '__main__'})
else:
    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)
"""


def run_measured(python_args: list[str]) -> tuple[float, float, str]:
    """Run `python <python_args>` (-m module args..., or -c code) in a fresh process.
    Returns (wall seconds, peak RSS in MiB, stdout)."""
    with tempfile.NamedTemporaryFile("r") as f:
        args = python_args[1:] if python_args[0] == "-m" else python_args
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _WRAPPER, f.name, *args], check=True,
                              stdout=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - t
        return seconds, int(f.read()) / 1024, proc.stdout


def peak_rss_mib(python_args: list[str]) -> float:
    return run_measured(python_args)[1]


def last_json_line(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def machine_line() -> str:
    return (f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}; {time.strftime('%Y-%m-%d')}")


def best_of(fn, repeat: int) -> float:
    """Best wall time of `repeat` calls, after one untimed warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best
