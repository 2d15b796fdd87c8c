"""Where the test suite's minutes go: every test phase's time, summed by what the phase started.

Runs pytest (by default ``make test``'s selection, three processes) with ``suite_cost_plugin``, which records each
set-up / call / teardown duration and what it started (Ray, worker groups, worker groups with a vLLM engine, whole
trainer runs, gloo spawns, HTTP servers, child processes), then prints:

- the wall time, the machine's CPU seconds over the run (all processes: Ray's workers included) and its utilisation;
- the phases' seconds by the costliest thing each started (a phase that started a vLLM group counts there even if
  it also started Ray);
- every kind of start: how many, and the seconds spent inside the starting calls;
- the slowest phases and the costliest test files.

Durations inside a parallel run are inflated by the other processes (two cores, three pytest processes): compare
shares, and compare runs made the same way. ::

    .venv/bin/python benchmarks/suite_cost.py                          # make test's selection
    .venv/bin/python benchmarks/suite_cost.py -- -m "long and not soak" -n 0   # what make test-long runs
    .venv/bin/python benchmarks/suite_cost.py --read benchmarks/results/suite_cost.jsonl   # a past run's summary
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAKE_TEST_ARGS = ["-q", "-n", "3", "--dist", "worksteal", "-m", "not soak and not long"]

COST_ORDER = ("vllm worker group", "whole run", "worker group", "gloo spawn (torch.multiprocessing)",
              "gloo rank process started", "hybridrl child process", "HTTP server", "ray start",
              "python child process", "other child process")
"""Categories from the costliest start down: a phase is counted under the first kind it started."""


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``: user + nice + system + irq + softirq)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(value) for value in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def cpu_description() -> str:
    """``/proc/cpuinfo``'s model name and the flags that decide the CPU's matmul speed."""
    text = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    wanted = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if flag in flags]
    return f"{model}; {os.cpu_count()} logical CPUs; flags: {' '.join(wanted) or 'none of avx2/avx512'}"


def run_suite(pytest_args: list[str], out: Path) -> dict[str, float]:
    """Run pytest with the plugin; the wall time, the machine's CPU seconds and pytest's exit status."""
    paths = [str(ROOT / "benchmarks"), str(ROOT / "tests" / "distributed"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "HYBRIDRL_SUITE_COST_OUT": str(out), "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    cpu_before, started = machine_cpu_seconds(), time.perf_counter()
    status = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cost_plugin", *pytest_args],
                            cwd=ROOT, env=env).returncode
    wall, cpu = time.perf_counter() - started, machine_cpu_seconds() - cpu_before
    return {"wall_s": wall, "machine_cpu_s": cpu, "exit_status": status}


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def category(starts: dict[str, list[float]]) -> str:
    return next((kind for kind in COST_ORDER if kind in starts), "nothing started")


def summarise(records: list[dict], top: int = 25) -> str:
    """The tables described in the module docstring, as text."""
    lines, total = [], sum(record["seconds"] for record in records) or 1e-9
    by_category: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    starts: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_file: dict[str, float] = defaultdict(float)
    for record in records:
        entry = by_category[category(record["starts"])]
        entry[0] += 1
        entry[1] += record["seconds"]
        for kind, (count, seconds) in record["starts"].items():
            starts[kind][0] += count
            starts[kind][1] += seconds
        by_file[record["nodeid"].split("::")[0]] += record["seconds"]
    lines.append(f"test phases: {len(records)}, their durations summed over the test processes: {total:.0f} s")
    lines.append("\nby the costliest thing a phase started:")
    lines.append(f"  {'started':36s} {'phases':>7s} {'seconds':>9s} {'share':>7s}")
    for kind, (count, seconds) in sorted(by_category.items(), key=lambda item: -item[1][1]):
        lines.append(f"  {kind:36s} {count:7d} {seconds:9.1f} {100 * seconds / total:6.1f}%")
    lines.append("\nstarts (seconds inside the starting call; a whole run's include the groups it starts):")
    for kind, (count, seconds) in sorted(starts.items(), key=lambda item: -item[1][1]):
        lines.append(f"  {kind:36s} {count:7d} {seconds:9.1f} s  ({seconds / max(count, 1):.1f} s each)")
    lines.append(f"\nthe {top} slowest phases:")
    for record in sorted(records, key=lambda r: -r["seconds"])[:top]:
        started = ", ".join(f"{int(count)} {kind}" for kind, (count, _) in record["starts"].items())
        lines.append(f"  {record['seconds']:7.1f} s {record['when']:8s} {record['nodeid']}"
                     + (f"  [{started}]" if started else ""))
    lines.append(f"\nthe {top} costliest files:")
    for path, seconds in sorted(by_file.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"  {seconds:7.1f} s  {path}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--read", type=Path, help="summarise a past run's records instead of running the suite")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "suite_cost.jsonl", help="where the records go")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("pytest_args", nargs="*", help="pytest's arguments after --, default: make test's selection")
    args = parser.parse_args(argv)
    if args.read:
        print(summarise(read_records(args.read), args.top))
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"[suite_cost] {cpu_description()}; load {os.getloadavg()[0]:.2f} at start", flush=True)
    run = run_suite(args.pytest_args or MAKE_TEST_ARGS, args.out)
    print(summarise(read_records(args.out), args.top))
    print(f"\n[suite_cost] wall {run['wall_s']:.0f} s, machine CPU {run['machine_cpu_s']:.0f} s "
          f"({100 * run['machine_cpu_s'] / run['wall_s'] / (os.cpu_count() or 1):.0f} % of {os.cpu_count()} CPUs), "
          f"pytest exit status {run['exit_status']}; records in {args.out}")
    return int(run["exit_status"])


if __name__ == "__main__":
    sys.exit(main())
