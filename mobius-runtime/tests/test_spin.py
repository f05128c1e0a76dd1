"""Intra-op spinning (``--spin``, ``Pipeline.load(spin=...)``): decided once at load, from
the mode and how busy the cores are; written into every session's options."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from mobius_runtime import Pipeline, ort_sessions, plugin
from mobius_runtime.errors import RequestError


@pytest.mark.parametrize(
    ("busy", "threads", "cores", "spins"),
    [
        (0.05, 2, 2, True),  # an idle 2-core machine, both cores wanted
        (0.30, 2, 2, False),  # another job holds a third of a core
        (1.9, 2, 2, False),  # the benchmark's own peer running
        (0.9, 1, 2, True),  # one thread: one free core is enough
        (1.5, 1, 2, False),
        (0.1, None, 2, True),  # onnxruntime's default count: every core
        (3.0, 4, 8, True),
        (5.0, 4, 8, False),
    ],
)
def test_auto_spins_only_when_the_needed_cores_are_free(monkeypatch, busy, threads, cores, spins):
    monkeypatch.setattr(ort_sessions, "_busy_cores", lambda: busy)
    monkeypatch.setattr(ort_sessions.os, "cpu_count", lambda: cores)
    got, why = ort_sessions.decide_spin("auto", threads, "cpu")
    assert got is spins
    assert f"{busy:.2f} of {cores} cores busy" in why


def test_on_off_and_cuda_do_not_look_at_the_machine(monkeypatch):
    def boom():
        raise AssertionError("/proc/stat read")

    monkeypatch.setattr(ort_sessions, "_busy_cores", boom)
    assert ort_sessions.decide_spin("on", 2, "cpu") == (True, "on")
    assert ort_sessions.decide_spin("off", 2, "cpu") == (False, "off")
    assert ort_sessions.decide_spin("auto", 2, "cuda") == (False, "auto: device cuda")


def test_auto_without_proc_stat_does_not_spin(monkeypatch):
    monkeypatch.setattr(ort_sessions, "_busy_cores", lambda: None)
    spins, why = ort_sessions.decide_spin("auto", 2, "cpu")
    assert not spins and "no /proc/stat" in why


def test_busy_cores_reads_a_share_of_the_cores():
    busy = ort_sessions._busy_cores(0.02)
    if busy is None:  # a platform without /proc/stat: the documented answer
        import os

        assert not os.path.exists("/proc/stat")
        return
    import os

    assert 0.0 <= busy <= (os.cpu_count() or 1) + 1e-9


def test_a_bad_mode_is_a_request_error():
    with pytest.raises(RequestError) as info:
        ort_sessions.decide_spin("fast", 2, "cpu")
    text = info.value.render()
    assert "spin='fast' is not one of auto, on, off" in text and "--spin" in text


@pytest.mark.parametrize("spin", [True, False])
def test_session_options_spin_inside_a_run_and_stop_after(spin):
    options = ort_sessions.session_options(2, spin)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == str(int(spin))
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    assert options.intra_op_num_threads == 2


def _spy_options(monkeypatch) -> list[tuple[int | None, bool]]:
    """(threads, spin) of every session's options made from now on."""
    calls: list[tuple[int | None, bool]] = []
    real = ort_sessions.session_options

    def spy(threads, spin=False):
        calls.append((threads, spin))
        return real(threads, spin)

    monkeypatch.setattr(ort_sessions, "session_options", spy)
    return calls


def test_pipeline_keeps_the_choice_and_both_give_the_same_ids(tiny_gqa_package, monkeypatch):
    calls = _spy_options(monkeypatch)
    on = Pipeline.load(tiny_gqa_package, device="cpu", threads=2, spin="on")
    opened_on, calls[:] = [spin for _, spin in calls], []
    off = Pipeline.load(tiny_gqa_package, device="cpu", threads=2, spin="off")
    opened = [spin for _, spin in calls]
    assert on.spin is True and off.spin is False
    # every session each pipeline opened got that pipeline's choice, and at least one opened
    assert opened_on and set(opened_on) == {True}
    assert opened and set(opened) == {False}
    ids = np.arange(3, 40, dtype=np.int64)[None].tolist()
    a = on.generate(input_ids=ids, max_new_tokens=12, stop_ids=())
    b = off.generate(input_ids=ids, max_new_tokens=12, stop_ids=())
    assert a.ids == b.ids


def _app():
    app = typer.Typer()
    plugin.mobius_add_commands(app)

    @app.command("noop", hidden=True)
    def noop() -> None:  # a second command keeps typer from flattening `run`
        pass

    return app


def test_cli_spin_flag(tiny_gqa_package):
    base = ["run", str(tiny_gqa_package), "--raw", "--prompt", "the", "--max-new-tokens", "4",
            "--device", "cpu", "--json"]  # fmt: skip
    runner = CliRunner()
    outs = [runner.invoke(_app(), [*base, "--spin", mode]) for mode in ("on", "off")]
    for out in outs:
        assert out.exit_code == 0, out.output
    assert (
        len({json.dumps(json.loads(o.stdout.strip().splitlines()[-1])["ids"]) for o in outs}) == 1
    )
    bad = runner.invoke(_app(), [*base, "--spin", "fast"])
    assert bad.exit_code == 1
    assert "spin='fast' is not one of auto, on, off" in bad.stderr
    assert "Traceback" not in bad.stderr


# ---------------------------------------------------------------- the intra-op thread count


@pytest.mark.parametrize(
    ("threads", "device", "size", "want"),
    [
        (2, "cpu", 1_000, 2),  # a count the caller gave is kept
        (3, "cpu", 10**9, 3),
        (None, "cpu", 2 * 2**20, 1),  # a small package: one thread
        (None, "cpu", ort_sessions.SMALL_MODEL_BYTES, None),  # at the limit: the default
        (None, "cpu", 10**9, None),
        (None, "cuda", 1_000, None),  # the GPU does the work
    ],
)
def test_decide_threads(threads, device, size, want):
    got, why = ort_sessions.decide_threads(threads, device, size)
    assert got == want
    assert why


def test_package_bytes_counts_each_component_folder(tmp_path):
    for name, size in (("a", 100), ("b", 2500)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.onnx").write_bytes(b"x" * size)
        (tmp_path / name / "model.onnx.data").write_bytes(b"y" * 7)
    paths = [tmp_path / "a" / "model.onnx", tmp_path / "b" / "model.onnx"]
    assert ort_sessions.package_bytes(paths) == 100 + 2500 + 14


def test_pipeline_opens_a_tiny_package_on_one_thread(tiny_gqa_package, monkeypatch):
    calls = _spy_options(monkeypatch)
    chosen = Pipeline.load(tiny_gqa_package, device="cpu")
    assert chosen.threads == 1 and calls and {t for t, _ in calls} == {1}
    calls.clear()
    given = Pipeline.load(tiny_gqa_package, device="cpu", threads=2)
    assert given.threads == 2 and calls and {t for t, _ in calls} == {2}
    ids = np.arange(3, 40, dtype=np.int64)[None].tolist()
    a = chosen.generate(input_ids=ids, max_new_tokens=12, stop_ids=())
    b = given.generate(input_ids=ids, max_new_tokens=12, stop_ids=())
    assert a.ids == b.ids
