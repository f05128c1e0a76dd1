"""The case schema: valid files load; every error names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from mobius_testing.cases import CaseError, find_cases, load_case

COMMIT = "0123456789abcdef0123456789abcdef01234567"
VALID = f'''
family = "demo"
model = "owner/model"
revision = "{COMMIT}"
task = "image-text-to-text"
dtype = "bf16"
levels = ["l4", "l5"]
size = "large"
[inputs]
prompt = "hi"
images = ["cat.png"]
[tolerances]
min_margin = 0.7
[l5]
max_new_tokens = 5
'''
REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "demo.case.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_valid_case_loads_with_defaults(tmp_path):
    case = load_case(write(tmp_path, VALID))
    assert case.id == "demo" and case.family == "demo" and case.revision == COMMIT
    assert case.levels == ("l4", "l5") and case.gpu is True and case.max_new_tokens == 5
    assert case.tolerances.min_margin == 0.7
    assert case.tolerances.logits_atol == 0.5  # bf16 default
    assert case.images == (tmp_path / "cat.png",)
    assert "media file" in case.skip_reason()  # cat.png does not exist


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        (f'revision = "{COMMIT}"', 'revision = "main"', "revision", "not a 40-hex commit"),
        (f'revision = "{COMMIT}"\n', "", "revision", "required field is missing"),
        ('dtype = "bf16"', 'dtype = "fp8"', "dtype", "not one of f32, f16, bf16"),
        ('levels = ["l4", "l5"]', 'levels = ["l4", "l9"]', "levels[1]", "'l9' is not one of"),
        ('levels = ["l4", "l5"]', "levels = []", "levels", "no level listed"),
        ('prompt = "hi"', "prompt = 3", "inputs.prompt", "expected str"),
        ('prompt = "hi"', 'prompt = "hi"\ncolour = 1', "inputs.colour", "unknown field"),
        ("min_margin = 0.7", "min_margin = -1", "tolerances.min_margin", "non-negative"),
        ("max_new_tokens = 5", "max_new_tokens = 0", "l5.max_new_tokens", "positive integer"),
        ('task = "image-text-to-text"', 'task = "text-generation"', "inputs.images", "no images"),
        ('model = "owner/model"', 'model = "nohub"', "model", "not a Hub id"),
        ('family = "demo"', 'familly = "demo"', "familly", "unknown field"),
    ],
)
def test_schema_errors_name_file_and_field(tmp_path, old, new, field, message):
    assert_schema_error(tmp_path, VALID, old, new, field, message)


def assert_schema_error(tmp_path, base, old, new, field, message):
    """``base`` with ``old`` replaced by ``new`` fails naming the file, ``field``, ``message``."""
    assert old in base
    path = write(tmp_path, base.replace(old, new, 1))
    with pytest.raises(CaseError) as err:
        load_case(path)
    text = str(err.value)
    assert f"{path}: field '{field}'" in text, text
    assert message in text


def test_unpinned_revision_skips_with_the_policy_reason(tmp_path):
    case = load_case(write(tmp_path, VALID.replace(COMMIT, "unpinned")))
    assert case.revision is None and case.unpinned
    assert "no pinned revision / weights unavailable" in case.skip_reason()


def test_local_path_case_resolves_relative_to_the_file(tmp_path):
    (tmp_path / "ckpt").mkdir()
    text = (
        'family = "demo"\npath = "ckpt"\ntask = "text-generation"\ndtype = "f32"\n'
        'levels = ["l5"]\n[inputs]\nprompt = "x"\n'
    )
    case = load_case(write(tmp_path, text))
    assert case.local and case.source == str(tmp_path / "ckpt") and case.gpu is False
    assert case.size == "tiny" and case.skip_reason() is None
    with pytest.raises(CaseError, match="a local 'path' case has no revision"):
        load_case(write(tmp_path, f'revision = "{COMMIT}"\n' + text, "r.case.toml"))


def test_bad_toml_names_the_file(tmp_path):
    path = write(tmp_path, "family = \n")
    with pytest.raises(CaseError, match="not valid TOML") as err:
        load_case(path)
    assert str(path) in str(err.value)


def test_the_gemma4_case_files_are_valid():
    files = find_cases([REPO / "mobius-gemma4" / "tests" / "cases"])
    assert len(files) >= 13
    cases = [load_case(f) for f in files]
    real = [c for c in cases if not c.local]
    assert {c.source for c in real} >= {
        "google/gemma-4-E2B-it",
        "google/gemma-4-E4B-it",
        "google/gemma-4-12B-it",
        "google/gemma-4-26B-A4B-it",
        "google/gemma-4-31B-it",
    }
    assert all(c.gpu for c in real)
    assert any(c.local and c.skip_reason() is None for c in cases)


SHA = "ab" * 32
GGUF = f'''
family = "demo"
gguf = "demo.Q4_1.gguf"
sha256 = "{SHA}"
task = "text-generation"
levels = ["l4", "l5"]
[inputs]
prompt = "hi"
'''


@pytest.fixture
def real_env(monkeypatch, tmp_path):
    """No real-model folder and no requirement, whatever the caller's environment."""
    from mobius_testing import cases

    for var in (*cases.REAL_FOLDERS, cases.REAL_REQUIRED):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_gguf_case_is_pinned_by_sha256_and_keeps_the_quantization(tmp_path, real_env):
    case = load_case(write(tmp_path, GGUF))
    assert case.gguf and case.gguf_sha256 == SHA and not case.unpinned
    assert case.source == "demo.Q4_1.gguf" and case.revision is None
    assert case.dtype is None and case.dtype_label == "kept" and case.gpu is False
    assert case.reference_dtype == "f32" and case.tolerances.logits_atol == 0.02
    text = GGUF.replace("[inputs]", 'dtype = "f16"\nreference_dtype = "f16"\n[inputs]')
    f16 = load_case(write(tmp_path, text, "h.case.toml"))
    assert f16.dtype == "f16" and f16.reference_dtype == "f16"


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ('gguf = "demo.Q4_1.gguf"', 'gguf = "../x/demo.gguf"', "gguf", "not a plain .gguf"),
        ('gguf = "demo.Q4_1.gguf"', 'gguf = "demo.bin"', "gguf", "not a plain .gguf"),
        (f'sha256 = "{SHA}"', 'sha256 = "abc"', "sha256", "is not a sha256"),
        (f'sha256 = "{SHA}"', f'sha256 = "{SHA.upper()}"', "sha256", "is not a sha256"),
        (f'sha256 = "{SHA}"\n', "", "sha256", "required field is missing"),
        (f'sha256 = "{SHA}"', f'sha256 = "{SHA}"\nrevision = "{COMMIT}"', "revision",
         "pinned by its sha256"),
        ('gguf = "demo.Q4_1.gguf"', 'gguf = "d.gguf"\nmodel = "o/m"', "model", "exactly one"),
        ('gguf = "demo.Q4_1.gguf"\n', 'model = "o/m"\nrevision = "unpinned"\n', "sha256",
         "only a 'gguf' case"),
        ('task = "text-generation"', 'task = "text-generation"\nreference_dtype = "fp8"',
         "reference_dtype", "not one of"),
    ],
)  # fmt: skip
def test_gguf_schema_errors_name_file_and_field(tmp_path, old, new, field, message):
    assert_schema_error(tmp_path, GGUF, old, new, field, message)


def test_absent_gguf_skips_saying_how_to_get_it(tmp_path, real_env):
    case = load_case(write(tmp_path, GGUF))
    reason = case.skip_reason()
    assert "demo.Q4_1.gguf is not here" in reason and "tox -e real-demo" in reason
    assert "MOBIUS_REAL_MODELS" in reason and SHA in reason
    real_env.setenv("MOBIUS_REAL_MODELS", str(tmp_path / "models"))
    assert f"MOBIUS_REAL_MODELS={tmp_path / 'models'}" in case.skip_reason()
    with pytest.raises(CaseError, match="was not found"):
        case.build_source()


def test_absent_gguf_fails_where_it_is_required(tmp_path, real_env):
    real_env.setenv("MOBIUS_REAL_REQUIRED", "1")
    case = load_case(write(tmp_path, GGUF))
    with pytest.raises(CaseError, match="MOBIUS_REAL_REQUIRED is set") as err:
        case.skip_reason()
    assert "tox -e real-demo" in str(err.value)


def test_gguf_found_in_either_folder_with_its_sha256(tmp_path, real_env):
    import hashlib

    cache = tmp_path / "cache"
    cache.mkdir()
    data = b"GGUF" + bytes(100)
    (cache / "demo.Q4_1.gguf").write_bytes(data)
    real_env.setenv("MOBIUS_REAL_MODELS", str(tmp_path / "nothing-here"))
    real_env.setenv("MOBIUS_REAL_CACHE", str(cache))
    real_env.setenv("MOBIUS_REAL_REQUIRED", "1")
    good = GGUF.replace(SHA, hashlib.sha256(data).hexdigest())
    case = load_case(write(tmp_path, good))
    assert case.skip_reason() is None
    assert case.build_source() == str(cache / "demo.Q4_1.gguf")


def test_gguf_with_another_sha256_fails_never_skips(tmp_path, real_env):
    (tmp_path / "demo.Q4_1.gguf").write_bytes(b"GGUF not the pinned file")
    real_env.setenv("MOBIUS_REAL_MODELS", str(tmp_path))
    case = load_case(write(tmp_path, GGUF))
    for call in (case.skip_reason, case.build_source):
        with pytest.raises(CaseError, match=f"the case pins {SHA}") as err:
            call()
        assert str(tmp_path / "demo.Q4_1.gguf") in str(err.value)


def test_the_real_model_case_files_are_valid_and_pin_the_fetched_files():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fetch_real", REPO / ".ci" / "fetch_real.py")
    fetch_real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch_real)
    files = find_cases([REPO / "mobius-llama" / "tests" / "cases",
                        REPO / "mobius-gemma3" / "tests" / "cases"])  # fmt: skip
    cases = [load_case(f) for f in files]
    assert {c.family for c in cases} == {"llama", "gemma3"} and len(cases) >= 4
    for case in cases:
        assert case.gguf and fetch_real.MODELS[case.source]["sha256"] == case.gguf_sha256
        assert (case.dtype, case.reference_dtype, case.gpu) in (
            (None, "f32", False),
            ("f16", "f16", True),
        )
        golden_dir = case.file.parent / "goldens"
        for level in case.levels:
            assert (golden_dir / f"{case.id}.{level}.json").is_file(), (case.id, level)


def test_regen_refuses_a_reference_whose_logits_are_not_finite(tmp_path):
    import numpy as np

    from mobius_testing.golden import Inputs
    from mobius_testing.reference import ReferenceError
    from mobius_testing.regen import regen_case

    class Overflowing:  # what HF's Gemma 3 does in float16
        def inputs(self, case):
            return Inputs((2, 3))

        def provenance(self, case):
            return {}

        def prefill_logits(self, inputs):
            return np.array([[0.0, 1.0], [np.nan, np.nan]])

    text = GGUF.replace("[inputs]", 'dtype = "f16"\nreference_dtype = "f16"\n[inputs]')
    case = load_case(write(tmp_path, text))
    with pytest.raises(ReferenceError, match="not finite") as err:
        regen_case(case, reference=Overflowing())
    assert "reference_dtype 'f16'" in str(err.value)
    assert not (tmp_path / "goldens").exists()
