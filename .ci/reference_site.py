"""Give the current (tox) environment the HF reference stack from one shared venv.

Why: six tox envs compare against HF transformers on torch (the parity envs and the
two real-model envs). Each used to ``pip install torch==2.13.0`` and transformers
itself: ~1.2 GB and 2-4 minutes per env on this 2-core machine (1m53 s for torch and
2m22 s for transformers + accelerate + gguf, measured under load), ~12 minutes of a
CI run's wall time and ~7 GB of disk. Now the first env to ask builds one venv at
``MOBIUS_REFERENCE_VENV`` (default ``.tox/.reference``) under a file lock, the others
wait for it, and each env gets a ``mobius-reference.pth`` line that appends that venv's
site-packages to its ``sys.path``. The env's own packages stay first on ``sys.path``;
pip sees the reference packages as installed, so ``mobius-testing[reference]``'s
``torch`` / ``transformers`` requirements are met without a second copy.

The venv is rebuilt when its stamp (the pip steps below) differs. torch is installed
first and pinned: the CPU wheel 2.13.0 lies on local disk, and letting transformers or
accelerate choose a torch would pull a multi-GB CUDA build.

    python .ci/reference_site.py      # in a tox env's commands_pre
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

STEPS = (
    ("torch==2.13.0",),
    ("transformers==5.24.0", "accelerate", "gguf"),
)
STAMP = ".mobius-reference.json"
BUILDING = ".mobius-reference-building"
PTH = "mobius-reference.pth"


def main() -> int:
    default = Path(__file__).resolve().parent.parent / ".tox" / ".reference"
    given = Path(os.environ.get("MOBIUS_REFERENCE_VENV") or default).absolute()
    if given.is_symlink():
        raise SystemExit(
            f"reference_site: {given} is a symlink; set MOBIUS_REFERENCE_VENV to a folder"
        )
    venv = given.resolve()
    here = Path.cwd().resolve()
    repo = Path(__file__).resolve().parent.parent
    if venv in (here, repo, Path.home().resolve()) or venv in here.parents or venv in repo.parents:
        raise SystemExit(
            f"reference_site: MOBIUS_REFERENCE_VENV={venv} is the working folder, the "
            "checkout, home or one of their parents; set it to a new folder"
        )
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        site = ensure(venv)
    purelib = Path(sysconfig.get_paths()["purelib"])
    if purelib.resolve() == site.resolve():
        raise SystemExit(f"reference_site: {sys.executable} is the reference venv itself")
    (purelib / PTH).write_text(f"{site}\n")
    probe = "import torch, transformers; print(torch.__version__, transformers.__version__)"
    check = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        raise SystemExit(f"reference_site: torch/transformers not importable:\n{check.stderr}")
    print(f"reference_site: {check.stdout.strip()} (via {purelib / PTH})")
    return 0


def ensure(venv: Path) -> Path:
    """The reference venv's site-packages, built first when missing or stale."""
    want = {"python": sys.version.split()[0], "steps": [list(s) for s in STEPS]}
    stamp = venv / STAMP
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == want:
                return site_of(venv)
        except ValueError:
            pass
    if venv.exists():
        # only a venv this script made (stamped, or marked while it was being built) is
        # ever deleted: MOBIUS_REFERENCE_VENV may name a folder of the caller's
        if not (stamp.is_file() or (venv / BUILDING).is_file()):
            raise SystemExit(
                f"reference_site: {venv} exists and was not made by .ci/reference_site.py; "
                "set MOBIUS_REFERENCE_VENV to a new folder (nothing was changed)"
            )
        shutil.rmtree(venv)
    print(f"reference_site: building {venv} ({'; '.join(' '.join(s) for s in STEPS)})", flush=True)
    venv.mkdir()
    (venv / BUILDING).write_text("made by .ci/reference_site.py, being built\n")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    for step in STEPS:
        subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", *step],
            check=True,
        )
    stamp.write_text(json.dumps(want) + "\n")
    (venv / BUILDING).unlink()
    return site_of(venv)


def site_of(venv: Path) -> Path:
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


if __name__ == "__main__":
    sys.exit(main())
