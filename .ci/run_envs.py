"""Run tox envs N at a time, longest first, and (in CI) delete each env once it is done.

Why not ``tox -p``: a full ``ci`` run creates ~27 virtual environments, six of them
with torch (~1.7 GB each), the two Ray envs ~1.1 GB each; kept side by side they
need ~20 GB, and CI once died on a full disk (``OSError: [Errno 28] No space left
on device`` while gemma4-parity unpacked torch). Here every env is its own ``tox -e
NAME`` process; when it ends, its junit files are copied to ``.tox/.ci/junit/NAME/``
and, with pruning on, its folder is deleted, so at most N envs exist at a time.
Everything shared stays: the wheelhouse, the real-model caches, the logs.

Order: longest first (the durations of the last run on this work dir, from
``.tox/.ci/durations.json``, else the static estimates below), so the two slots end
close together.

    python .ci/run_envs.py [--parallel N] [--prune | --keep] ENV [ENV ...]

Pruning is on by default when ``CI`` is true, off otherwise (a developer's envs are
reused between runs); ``MOBIUS_CI_PRUNE=1`` / ``0`` overrides. Each env's output goes
to ``.tox/.ci/logs/NAME.log``; a failing env's last lines are printed. Exit status 1
when any env failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOXWORK = ROOT / ".tox"
STATE = TOXWORK / ".ci"

# seconds, from the last full clean-clone run (2 at a time, 2 cores); only the order matters
ESTIMATES = {
    "real-gemma3": 720,
    "real-llama": 420,
    "runtime": 340,
    "gemma4-parity": 330,
    "qwen3-parity": 300,
    "ray": 230,
    "core": 220,
    "gemma4": 215,
    "gemma3-parity": 200,
    "llama-parity": 200,
    "genai": 180,
    "families": 150,
}
DEFAULT_ESTIMATE = 90
TAIL_LINES = 150
NOISE = "WARNING: Location 'file:///opt/"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("envs", nargs="+", help="tox env names")
    parser.add_argument("--parallel", type=int, default=2, help="envs at a time (default 2)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--prune", dest="prune", action="store_true", default=None)
    group.add_argument("--keep", dest="prune", action="store_false")
    args = parser.parse_args(argv)
    prune = decide_prune(args.prune)

    # .tox/.ci/{logs,junit} hold only what this script wrote in its last run
    for sub in ("logs", "junit"):
        folder = STATE / sub
        if folder.is_symlink():
            raise SystemExit(f"run_envs: {folder} is a symlink; remove it yourself")
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    durations = load_durations()
    order = sorted(
        dict.fromkeys(args.envs),
        key=lambda e: -durations.get(e, ESTIMATES.get(e, DEFAULT_ESTIMATE)),
    )
    print(
        f"ci: {len(order)} envs, {args.parallel} at a time, longest first;"
        f" pruning {'on' if prune else 'off'}; disk free {disk_free()}",
        flush=True,
    )

    waiting = list(order)
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    results: dict[str, tuple[str, float]] = {}
    try:
        while waiting or running:
            while waiting and len(running) < max(1, args.parallel):
                name = waiting.pop(0)
                running[name] = (start(name), time.monotonic())
                print(f"ci: start {name}", flush=True)
            time.sleep(0.5)
            for name, (proc, began) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                took = time.monotonic() - began
                outcome = finish(name, proc.returncode, took, prune)
                results[name] = (outcome, took)
    except KeyboardInterrupt:
        for proc, _ in running.values():
            proc.terminate()
        raise

    save_durations(durations, results)
    print("\n================================ ci summary ================================")
    for name in order:
        outcome, took = results[name]
        mark = {"OK": "✔", "SKIP": "⚠"}.get(outcome, "✖")
        print(f"  {name}: {outcome} {mark} in {took:.1f} seconds")
    return 1 if any(outcome == "FAIL" for outcome, _ in results.values()) else 0


def decide_prune(flag: bool | None) -> bool:
    if flag is not None:
        return flag
    setting = os.environ.get("MOBIUS_CI_PRUNE")
    if setting is not None:
        return setting.strip().lower() not in ("", "0", "false", "no")
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def start(name: str) -> subprocess.Popen:
    log = open(STATE / "logs" / f"{name}.log", "wb")  # noqa: SIM115 (closed with the child)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tox", "-e", name],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    return proc


def finish(name: str, returncode: int, took: float, prune: bool) -> str:
    log = STATE / "logs" / f"{name}.log"
    lines = [
        line
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
        if not line.startswith(NOISE)
    ]
    skipped = any(line.strip().startswith(f"{name}: SKIP") for line in lines[-20:])
    outcome = "FAIL" if returncode != 0 else ("SKIP" if skipped else "OK")
    env_dir = TOXWORK / name
    junit = sorted(env_dir.glob("junit*.xml")) if env_dir.is_dir() else []
    if junit:
        keep = STATE / "junit" / name
        keep.mkdir(parents=True, exist_ok=True)
        for path in junit:
            shutil.copy2(path, keep / path.name)
    if outcome == "FAIL":
        print(f"\n---- {name}: last {TAIL_LINES} lines of {log} ----")
        print("\n".join(lines[-TAIL_LINES:]))
        print(f"---- end of {name} ----\n", flush=True)
    pruned = ""
    if prune and is_tox_env(name, env_dir):
        shutil.rmtree(env_dir, ignore_errors=True)
        pruned = ", env deleted"
    print(
        f"ci: {name} {outcome} in {took:.0f}s (exit {returncode}{pruned}; disk free {disk_free()})",
        flush=True,
    )
    return outcome


ENV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def is_tox_env(name: str, env_dir: Path) -> bool:
    """Whether ``env_dir`` is a folder tox made for env ``name`` and nothing else: a plain
    env name (no ``..``, no separator), a real folder (no symlink) directly inside this
    checkout's ``.tox``, holding the ``.tox-info.json`` and ``pyvenv.cfg`` tox writes.
    Only such a folder is ever deleted."""
    if not ENV_NAME.fullmatch(name) or ".." in name:
        return False
    if env_dir.is_symlink() or not env_dir.is_dir():
        return False
    if env_dir.resolve().parent != TOXWORK.resolve():
        return False
    return (env_dir / ".tox-info.json").is_file() and (env_dir / "pyvenv.cfg").is_file()


def disk_free() -> str:
    TOXWORK.mkdir(exist_ok=True)
    return f"{shutil.disk_usage(TOXWORK).free / 2**30:.1f} GiB"


def load_durations() -> dict[str, float]:
    try:
        data = json.loads((STATE / "durations.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float)}


def save_durations(durations: dict[str, float], results: dict[str, tuple[str, float]]) -> None:
    merged = dict(durations)
    merged.update({name: took for name, (outcome, took) in results.items() if outcome == "OK"})
    (STATE / "durations.json").write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.exit(main())
