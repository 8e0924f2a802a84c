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
    from hpccoll.core.ops import dtype_name
    assert dtype_name(np.dtype(np.float64)) == "float64"
    assert dtype_name(np.dtype(np.float32)) == "float32"
