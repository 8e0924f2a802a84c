"""The settings registry: precedence, validation, and the generated docs page."""
from pathlib import Path

import pytest

from hpccoll import config
from hpccoll.errors import ArgumentError


def test_precedence_argument_environment_default():
    env = {"HPCCOLL_CHUNK_BYTES": "2M", "HPCCOLL_MAX_ACTIVE": "3"}
    s = config.resolve({"max_active": 5}, environ=env)
    assert s.max_active == 5 and s.sources["max_active"] == "argument"
    assert s.chunk_bytes == 2 << 20 and s.sources["chunk_bytes"] == "environment"
    assert s.spin_threshold == 80 and s.sources["spin_threshold"] == "default"


def test_every_setting_has_a_documented_twin():
    for st in config.SETTINGS:
        assert st.env == "HPCCOLL_" + st.name.upper()
        assert len(st.doc) > 20


def test_bad_values_name_the_setting():
    with pytest.raises(ArgumentError, match="unknown option"):
        config.resolve({"chunk": 1})
    with pytest.raises(ArgumentError, match="max_active"):
        config.resolve({"max_active": 0})
    with pytest.raises(ArgumentError, match="HPCCOLL_TIMEOUT"):
        config.resolve(environ={"HPCCOLL_TIMEOUT": "soon"})
    with pytest.raises(ArgumentError, match="HPCCOLL_CHECK_MISMATCH"):
        config.resolve(environ={"HPCCOLL_CHECK_MISMATCH": "maybe"})


def test_timeout_off_spellings():
    for text in ("", "none", "off", "0"):
        assert config.resolve(environ={"HPCCOLL_TIMEOUT": text}).timeout is None
    assert config.resolve({"timeout": 0}).timeout is None


def test_docs_page_is_generated_from_the_registry():
    page = Path(__file__).parents[2] / "docs" / "config.md"
    assert page.read_text() == config.markdown(), \
        "docs/config.md is stale: run python -m hpccoll config --markdown > docs/config.md"


def test_describe_lists_sources():
    text = config.describe(config.resolve({"policy": "fifo"}))
    assert "policy" in text and "argument" in text and "HPCCOLL_POLICY" in text


def test_dtype_names_with_and_without_bfloat16():
    import numpy as np
    from hpccoll.base.ops import dtype_name
    assert dtype_name(np.dtype(np.float64)) == "float64"
    assert dtype_name(np.dtype(np.float32)) == "float32"


def test_nan_is_not_a_number_any_setting_accepts():
    """nan compares false with every bound: accepted, timeout=nan turned the watchdog off."""
    with pytest.raises(ArgumentError, match="argument timeout: expected a number, got nan"):
        config.resolve({"timeout": float("nan")}, environ={})
    with pytest.raises(ArgumentError, match="HPCCOLL_TIMEOUT: expected a number, got nan"):
        config.resolve(environ={"HPCCOLL_TIMEOUT": "nan"})
    with pytest.raises(ArgumentError, match="HPCCOLL_SPIN_US: expected a number, got nan"):
        config.resolve(environ={"HPCCOLL_SPIN_US": "NaN"})
    assert config.resolve({"timeout": float("inf")}, environ={}).timeout == float("inf")


def test_a_misspelt_variable_is_named_with_the_closest_setting():
    from hpccoll import config
    config._WARNED.clear()
    with pytest.warns(UserWarning, match="HPCCOLL_TIMEOUTT is not an hpccoll setting and is "
                                         "ignored; did you mean HPCCOLL_TIMEOUT"):
        s = config.resolve(environ={"HPCCOLL_TIMEOUTT": "5"})
    assert s.timeout is None
    with pytest.warns(UserWarning, match="HPCCOLL_QWZRTY is not an hpccoll setting.*"
                                         "python -m hpccoll config"):
        config.resolve(environ={"HPCCOLL_QWZRTY": "1"})
    # once per name; the tools' own variables and real settings say nothing
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.resolve(environ={"HPCCOLL_TIMEOUTT": "5", "HPCCOLL_ROOT": "/x",
                         "HPCCOLL_TEST_POLICY": "fifo", "HPCCOLL_TIMEOUT": "5"})
    assert config.unknown_variables({"HPCCOLL_POLICYY": "x", "HPCCOLL_VENV": "v",
                                     "OTHER": "1"}) == [("HPCCOLL_POLICYY", "HPCCOLL_POLICY")]


def test_launch_settings_are_bounded(monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")      # a real device (tests run simulated)
    with pytest.raises(ArgumentError, match="threads_per_block: expected a multiple of 32"):
        config.resolve({"threads_per_block": 100}, environ={})
    with pytest.raises(ArgumentError, match="HPCCOLL_THREADS_PER_BLOCK: expected a value <= 1024"):
        config.resolve(environ={"HPCCOLL_THREADS_PER_BLOCK": "2048"})
    assert config.resolve({"threads_per_block": 1024}, environ={}).threads_per_block == 1024
    for name in ("blocks", "max_blocks"):
        with pytest.raises(ArgumentError, match=f"{name}: expected a value <= 65536"):
            config.resolve({name: 1 << 20}, environ={})


def test_the_cuda_simulator_takes_partial_warps(monkeypatch):
    """Its threads are Python threads: tests run it with 4 per block."""
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert config.resolve({"threads_per_block": 4}, environ={}).threads_per_block == 4


def test_every_variable_the_scripts_set_is_known():
    """A variable CI or a script exports that is neither a setting nor a tool's own makes
    every hpccoll process warn (a test that reads a tool's stderr then fails)."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    files = [p for d in ("scripts", ".ci", "slurm") for p in (root / d).rglob("*") if p.is_file()]
    files += list((root / "tests").glob("*.py"))
    used = set()
    for p in files:
        try:
            used |= set(re.findall(r"HPCCOLL_[A-Z][A-Z_0-9]*", p.read_text()))
        except UnicodeDecodeError:
            continue
    known = {s.env for s in config.SETTINGS} | config.TOOL_VARIABLES
    assert used - known == set()
