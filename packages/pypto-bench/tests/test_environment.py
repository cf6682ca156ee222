"""NPU environment variables are set from the device spec before the device initialises."""

from __future__ import annotations

import pytest

from pypto_bench.environment import NPU_ALLOC_CONF_DEFAULT, prepare_device_env


@pytest.fixture
def fake_torch_npu_on_path(tmp_path, monkeypatch):
    """An importable (never imported) torch_npu so the NPU branch is taken on this CPU box."""
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text(
        "raise ImportError('not a real torch_npu')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PYTORCH_NPU_ALLOC_CONF", raising=False)
    monkeypatch.delenv("TILE_FWK_DEVICE_ID", raising=False)


def test_npu_spec_sets_alloc_conf(fake_torch_npu_on_path, monkeypatch):
    import os

    assert prepare_device_env("npu:3") == []
    assert os.environ["PYTORCH_NPU_ALLOC_CONF"] == NPU_ALLOC_CONF_DEFAULT
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:False")
    assert prepare_device_env("1") == []
    assert os.environ["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:False"  # user's choice kept


def test_tile_fwk_device_id_is_no_longer_set_or_warned_about(fake_torch_npu_on_path, monkeypatch):
    """nox -s npu_api found that PyPTO 0.2.0 never reads TILE_FWK_DEVICE_ID: setting it (and
    warning that a user's value differs) was advice about a variable nothing reads."""
    import os

    assert prepare_device_env("npu:3") == []
    assert "TILE_FWK_DEVICE_ID" not in os.environ
    monkeypatch.setenv("TILE_FWK_DEVICE_ID", "5")
    assert prepare_device_env("npu:1") == []
    assert os.environ["TILE_FWK_DEVICE_ID"] == "5"


def test_the_variable_set_is_the_declared_env_row():
    from pypto_bench.environment import ALLOC_CONF, NPU

    assert ALLOC_CONF == "PYTORCH_NPU_ALLOC_CONF"
    assert [r.path for r in NPU.rows if r.kind == "env"] == ["torch_npu.PYTORCH_NPU_ALLOC_CONF"]


def test_cpu_and_cuda_specs_leave_npu_env_alone(fake_torch_npu_on_path):
    import os

    for spec in ("cpu", "cuda:1"):
        assert prepare_device_env(spec) == []
    assert "PYTORCH_NPU_ALLOC_CONF" not in os.environ
    assert "TILE_FWK_DEVICE_ID" not in os.environ
