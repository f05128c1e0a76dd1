"""How long ``import mobius.cli`` and ``mobius --help`` take: median of N fresh interpreters.

Run: ``python benchmarks/cli_import.py [N]`` (default 10) in an environment with
mobius installed. Reports the ``-X importtime`` cumulative figure of ``mobius.cli``
and the wall time of ``mobius --help`` (plugins loaded), median and spread. The
issue's target is an import under 0.3 s here; tests never assert on time (a busy
machine would make them flaky), this script is where the number is measured.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

HELP = "import sys; from mobius.cli import main; sys.argv = ['mobius', '--help']; main()"


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


def help_seconds() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", HELP], capture_output=True, check=False)
    return time.perf_counter() - started


def report(name: str, samples: list[float]) -> None:
    print(
        f"{name:<34} median {statistics.median(samples):.3f} s  "
        f"min {min(samples):.3f} s  max {max(samples):.3f} s  (n={len(samples)})"
    )


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    report("import mobius.cli (cumulative)", [importtime_seconds() for _ in range(n)])
    report("mobius --help (wall, process)", [help_seconds() for _ in range(n)])


if __name__ == "__main__":
    main()
