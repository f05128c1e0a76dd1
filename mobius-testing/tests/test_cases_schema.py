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
    assert old in VALID
    path = write(tmp_path, VALID.replace(old, new, 1))
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
