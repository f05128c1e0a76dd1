"""How long ``import mobius.cli``, ``mobius --help`` and ``mobius plugins`` take.

Run: ``python benchmarks/cli_import.py [N]`` (default 10) in an environment with
mobius installed. Reports the ``-X importtime`` cumulative figure of ``mobius.cli``
and the wall time of ``mobius --help``, ``mobius build --help`` and ``mobius
plugins`` (fresh interpreters, every installed plugin loaded), median and spread,
with the load average, and the bare interpreter start (``python -c pass``) as the
floor measured in the same run. The target is 0.5 s wall for every help and for
``mobius plugins``; tests never assert on time (a busy machine would make them
flaky), they pin which heavy modules must not be imported
(``mobius-core/tests/test_importtime.py``); this script is where the time is measured.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

CLI = "import sys; from mobius.cli import main; main(sys.argv[1:])"
COMMANDS = (["--help"], ["build", "--help"], ["plugins"])


def importtime_seconds() -> float:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import mobius.cli"],
        capture_output=True,
        text=True,
        check=True,
    )
    for line in done.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == "mobius.cli":
            return int(parts[1]) / 1e6
    raise SystemExit("mobius.cli not found in -X importtime output")


def wall_cpu_seconds(*args: str) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one fresh interpreter running ``args``.

    CPU time is what the command costs whatever else runs; wall time is what the
    user waits, and grows with the load average on a shared machine.
    """
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", *args], capture_output=True, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def report(name: str, samples: list[float]) -> None:
    print(
        f"{name:<34} median {statistics.median(samples):.3f} s  "
        f"min {min(samples):.3f} s  max {max(samples):.3f} s  (n={len(samples)})"
    )


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    import os

    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    floor = [wall_cpu_seconds("pass") for _ in range(n)]
    report("python -c pass (floor, wall)", [w for w, _ in floor])
    report("import mobius.cli (cumulative)", [importtime_seconds() for _ in range(n)])
    for command in COMMANDS:
        samples = [wall_cpu_seconds(CLI, *command) for _ in range(n)]
        report(f"mobius {' '.join(command)} (wall)", [w for w, _ in samples])
        report(f"mobius {' '.join(command)} (cpu)", [c for _, c in samples])
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")


if __name__ == "__main__":
    main()
