"""docs/architecture.md §1's dependency rules, enforced on the source tree and at import time.

- torch and transformers are never imported by mobius-core, mobius-gemma4,
  mobius-qwen3, mobius-llama or mobius-runtime (not even lazily inside a function): building and
  running a model must work without them.
- onnxruntime is never imported by mobius-core or a family (mobius-gemma4, mobius-qwen3,
  mobius-llama).
- core never imports a plugin; plugins never import each other, except
  mobius-testing → mobius-runtime.
- every third-party module a distribution's src imports is declared in its
  ``pyproject.toml`` (``dependencies`` or a non-test extra), and every runtime
  dependency is imported by its src (test-only ones belong in ``[test]``).

The static half walks the AST of every ``.py`` file under each ``src/`` (so an
import on a path no test exercises is still caught, including
``importlib.import_module("...")`` and ``__import__("...")`` with a literal name).
The dynamic half imports the modules in a fresh interpreter and inspects
``sys.modules`` (so an indirect import through a third library is caught too).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]

# folder -> (import name, top-level modules it must never import)
PLUGINS = ("mobius_gemma4", "mobius_qwen3", "mobius_llama", "mobius_runtime", "mobius_testing")
HEAVY_REFERENCE = {"torch", "transformers"}
FAMILIES = {"mobius_gemma4", "mobius_qwen3", "mobius_llama"}
FAMILY_FORBIDDEN = HEAVY_REFERENCE | {
    "onnxruntime",
    "onnxruntime_genai",
    "mobius_runtime",
    "mobius_testing",
}
RULES: dict[str, tuple[str, set[str]]] = {
    "mobius-core": ("mobius", HEAVY_REFERENCE | {"onnxruntime", "onnxruntime_genai", *PLUGINS}),
    **{
        family.replace("_", "-"): (family, FAMILY_FORBIDDEN | (FAMILIES - {family}))
        for family in sorted(FAMILIES)
    },
    "mobius-runtime": ("mobius_runtime", HEAVY_REFERENCE | FAMILIES | {"mobius_testing"}),
    "mobius-testing": ("mobius_testing", set(FAMILIES)),
}


def _imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted module name) of every absolute import in ``tree``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if (
                name in {"import_module", "__import__", "importorskip"}
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and not first.value.startswith(".")
            ):
                found.append((node.lineno, first.value))
    return found


def _violations(folder: str) -> list[str]:
    _, forbidden = RULES[folder]
    src = REPO / folder / "src"
    problems = []
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, name in _imported_names(tree):
            top = name.split(".", 1)[0]
            if top in forbidden:
                problems.append(f"{path.relative_to(REPO)}:{line}: imports {name}")
    return problems


@pytest.mark.parametrize("folder", sorted(RULES))
def test_static_imports_follow_the_rules(folder: str) -> None:
    src = REPO / folder / "src" / RULES[folder][0]
    if not src.is_dir():
        pytest.fail(f"{src} is missing")
    assert list(src.rglob("*.py")), f"no sources under {src}"
    assert _violations(folder) == []


def test_the_checker_sees_every_import_form(tmp_path: Path) -> None:
    """The walker catches top-level, lazy, from-, importlib and __import__ imports."""
    code = (
        "import os\n"
        "import torch.nn as nn\n"
        "from transformers import AutoModel\n"
        "def f():\n"
        "    import onnxruntime\n"
        "    from . import sibling\n"
        "    return importlib.import_module('mobius_gemma4.plugin'), __import__('torch')\n"
    )
    names = [name for _, name in _imported_names(ast.parse(code))]
    assert names == [
        "os",
        "torch.nn",
        "transformers",
        "onnxruntime",
        "mobius_gemma4.plugin",
        "torch",
    ]


# ---------------------------------------------------------------- dynamic


def _entry_point_modules(folder: str) -> list[str]:
    project = tomllib.loads((REPO / folder / "pyproject.toml").read_text(encoding="utf-8"))
    eps = project["project"].get("entry-points", {}).get("mobius", {})
    return [value.split(":", 1)[0] for value in eps.values()]


_PROBE = r"""
import importlib, json, pkgutil, sys
roots, walk = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for name in roots:
    importlib.import_module(name)
for name in walk:
    package = importlib.import_module(name)
    for info in pkgutil.walk_packages(package.__path__, name + "."):
        importlib.import_module(info.name)
print(json.dumps(sorted({m.split(".", 1)[0] for m in sys.modules})))
"""


def _loaded_after(roots: list[str], walk: list[str]) -> set[str]:
    """Top-level modules in ``sys.modules`` of a fresh interpreter after the imports.

    The plugin ``src`` folders go on ``PYTHONPATH`` so the check also runs where
    only mobius-core is installed (the ``core`` tox env).
    """
    env = dict(os.environ)
    folders = ("mobius-gemma4", "mobius-qwen3", "mobius-llama", "mobius-runtime", "mobius-testing")
    extra = [str(REPO / f / "src") for f in folders]
    env["PYTHONPATH"] = os.pathsep.join([*extra, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("MOBIUS_PLUGINS", None)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(roots), json.dumps(walk)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_core_and_cli_import_no_forbidden_module() -> None:
    """Every module of mobius-core, imported, pulls in no torch, transformers, onnxruntime."""
    loaded = _loaded_after(["mobius", "mobius.cli"], ["mobius"])
    assert "onnx_ir" in loaded, "the probe did not import mobius's submodules"
    assert loaded & RULES["mobius-core"][1] == set()


def test_gemma4_imports_no_forbidden_module() -> None:
    pytest.importorskip("numpy")
    loaded = _loaded_after(_entry_point_modules("mobius-gemma4"), ["mobius_gemma4"])
    assert "mobius_gemma4" in loaded
    assert loaded & RULES["mobius-gemma4"][1] == set()


@pytest.mark.parametrize("folder", ["mobius-qwen3", "mobius-llama"])
def test_decoder_family_imports_no_forbidden_module(folder: str) -> None:
    name = RULES[folder][0]
    loaded = _loaded_after(_entry_point_modules(folder), [name])
    assert name in loaded
    assert loaded & RULES[folder][1] == set()


def test_plugin_entry_points_import_no_reference_stack() -> None:
    """The modules the CLI loads at start-up (every entry point) stay light.

    ``mobius --help`` imports every entry-point module, so none may pull in torch,
    transformers or onnxruntime at import time (the runtime imports it lazily).
    """
    modules = [
        m
        for f in (
            "mobius-gemma4",
            "mobius-qwen3",
            "mobius-llama",
            "mobius-runtime",
            "mobius-testing",
        )
        for m in _entry_point_modules(f)
    ]
    assert modules, "no plugin declares a mobius entry point"
    loaded = _loaded_after(modules, [])
    assert loaded & (HEAVY_REFERENCE | {"onnxruntime", "onnxruntime_genai"}) == set()


# ---------------------------------------------------------------- declarations

# Import names whose distribution has another name, for when it is not installed here
# (an optional extra such as mobius-testing[reference]); installed ones are looked up.
DIST_OF_IMPORT = {
    "mobius": "mobius-core",
    "mobius_gemma4": "mobius-gemma4",
    "mobius_qwen3": "mobius-qwen3",
    "mobius_llama": "mobius-llama",
    "mobius_runtime": "mobius-runtime",
    "mobius_testing": "mobius-testing",
    "PIL": "pillow",
    "onnx_ir": "onnx-ir",
    "ml_dtypes": "ml-dtypes",
    "huggingface_hub": "huggingface-hub",
    "onnxruntime": "onnxruntime-gpu",
    "onnxruntime_genai": "onnxruntime-genai",
}
# Declared runtime dependencies that src does not import by name, with the reason.
DECLARED_NOT_IMPORTED = {
    ("mobius-core", "onnx"): "the floor of the onnx that onnx-ir and onnxscript serialise with",
}


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _declared(folder: str) -> tuple[set[str], set[str]]:
    """(runtime dependencies, dependencies of non-test extras) of ``folder``, canonical names."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / folder / "pyproject.toml").read_text(encoding="utf-8"))
    project = project["project"]
    runtime = {_canon(Requirement(r).name) for r in project.get("dependencies", [])}
    extras = {
        _canon(Requirement(r).name)
        for extra, reqs in project.get("optional-dependencies", {}).items()
        if extra != "test"
        for r in reqs
    }
    return runtime, extras


def _third_party_imports(folder: str) -> dict[str, list[str]]:
    """{top-level import name: ["path:line", ...]} of every non-stdlib import in src."""
    own = RULES[folder][0]
    found: dict[str, list[str]] = {}
    for path in sorted((REPO / folder / "src").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, name in _imported_names(tree):
            top = name.split(".", 1)[0]
            if top == own or top in sys.stdlib_module_names or top == "__future__":
                continue
            found.setdefault(top, []).append(f"{path.relative_to(REPO)}:{line}")
    return found


def _distributions(top: str) -> set[str]:
    from importlib.metadata import packages_distributions

    if top in DIST_OF_IMPORT:
        return {DIST_OF_IMPORT[top]}
    installed = packages_distributions().get(top)
    return {_canon(d) for d in installed} if installed else {_canon(top)}


@pytest.mark.parametrize("folder", sorted(RULES))
def test_every_third_party_import_is_declared(folder: str) -> None:
    """Each module src imports (lazily too) comes from a dependency or a non-test extra."""
    runtime, extras = _declared(folder)
    problems = [
        f"{where[0]}: imports {top} (distribution {' or '.join(sorted(_distributions(top)))}), "
        f"which {folder}/pyproject.toml does not declare ({len(where)} place(s))"
        for top, where in sorted(_third_party_imports(folder).items())
        if not _distributions(top) & (runtime | extras)
    ]
    assert problems == []


@pytest.mark.parametrize("folder", sorted(RULES))
def test_every_runtime_dependency_is_imported(folder: str) -> None:
    """Nothing in ``dependencies`` is there for the tests only (those go in ``[test]``)."""
    runtime, _ = _declared(folder)
    imported = set().union(*(_distributions(t) for t in _third_party_imports(folder)))
    unused = sorted(d for d in runtime - imported if (folder, d) not in DECLARED_NOT_IMPORTED)
    assert unused == [], f"{folder} declares {unused} but its src never imports them"


def test_the_declaration_check_catches_a_missing_declaration(tmp_path: Path) -> None:
    """The lookup maps import names to distributions the way the two tests above rely on."""
    assert _distributions("PIL") == {"pillow"}
    assert _distributions("onnx_ir") == {"onnx-ir"}
    assert _distributions("mobius") == {"mobius-core"}
    assert _distributions("numpy") == {"numpy"}
    runtime, extras = _declared("mobius-testing")
    assert {"torch", "transformers"} <= extras and "hypothesis" in extras
    assert "pytest" in runtime and "torch" not in runtime
