"""Property: over random folder contents, config.json and tokenizer_config.json values,
apply + restore never loses or corrupts a byte, apply changes exactly what the plan
says, and the pinned view keeps no auto_map entry the preset does not cover."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pypto_patch as pp
from pypto_patch.presets import auto_map_modules

NAMES = st.one_of(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=12),
    st.sampled_from(
        ["modeling_tinytest.py", "configuration_tinytest.py", "extras", "model.safetensors"]
    ),
).filter(
    lambda n: (
        n not in (".", "..", "config.json") and not n.startswith(".pypto") and "pypto_" not in n
    )
)

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
CONFIGS = st.dictionaries(
    st.text(max_size=10).filter(lambda k: k != "auto_map"), JSON_VALUES, max_size=6
)
AUTO_MAPS = st.dictionaries(
    st.sampled_from(
        ["AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoTokenizer", "AutoProcessor"]
    ),
    st.sampled_from(["modeling_remote.X", "configuration_remote.C", "tokenization_remote.T"]),
    max_size=4,
)
TOKENIZER_MAPS = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(["AutoTokenizer", "AutoProcessor", "AutoConfig", "AutoModelForCausalLM"]),
        st.one_of(
            st.sampled_from(["tokenization_remote.T", "org/repo--tokenization_x.T"]),
            st.lists(
                st.one_of(st.none(), st.just("tokenization_remote.T")), min_size=2, max_size=2
            ),
        ),
        max_size=3,
    ),
    st.lists(st.one_of(st.none(), st.just("tokenization_remote.T")), min_size=2, max_size=2),
)
FOLDERS = st.dictionaries(
    st.lists(NAMES, min_size=1, max_size=3).map("/".join), st.binary(max_size=200), max_size=8
)


def _write(root: Path, files: dict[str, bytes], config_bytes: bytes, modes: list[int]) -> bool:
    root.mkdir()
    for i, (rel, data) in enumerate(sorted(files.items())):
        target = root / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                return False
            target.write_bytes(data)
            os.chmod(target, modes[i % len(modes)])
        except (NotADirectoryError, FileExistsError, IsADirectoryError):
            return False  # a path used both as file and folder: not a real folder layout
    (root / "config.json").write_bytes(config_bytes)
    return True


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    files=FOLDERS,
    config=CONFIGS,
    auto_map=st.one_of(st.none(), AUTO_MAPS),
    family=st.sampled_from(["tinytest", "tinytest_alt"]),
    indent=st.sampled_from([None, 2, 4]),
    modes=st.lists(st.sampled_from([0o644, 0o600, 0o755, 0o444]), min_size=1, max_size=3),
    overlay=st.booleans(),
    tok_map=TOKENIZER_MAPS,
)
def test_apply_restore_never_loses_a_byte(
    snap, files, config, auto_map, family, indent, modes, overlay, tok_map
):
    cfg = dict(config)
    if auto_map is not None:
        cfg["auto_map"] = auto_map
    config_bytes = json.dumps(cfg, indent=indent).encode()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "m"
        if not _write(root, files, config_bytes, modes):
            return
        tok_cfg = {"model_max_length": 8} if tok_map is None else {"auto_map": tok_map}
        (root / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=indent))
        before = snap(root)
        preset = pp.get_preset(family)
        out = Path(tmp) / "ov" if overlay else None
        try:
            res = pp.apply(root, family=family, output_dir=out)
        except pp.UnsafePathError:
            # the random folder has a file where the preset needs a folder (or vice versa)
            assert snap(root) == before
            return
        target = out if overlay else root
        new_cfg = json.loads((target / "config.json").read_text())
        assert {k: v for k, v in new_cfg.items() if k != "auto_map"} == {
            k: v for k, v in cfg.items() if k != "auto_map"
        }
        # pinned: exactly the preset's map; the folder's other entries are removed and listed
        assert new_cfg["auto_map"] == preset.auto_map
        expected = [("config.json", k) for k in sorted(auto_map or {}) if k not in preset.auto_map]
        if isinstance(tok_map, list):
            expected.append(("tokenizer_config.json", "AutoTokenizer"))
        elif tok_map:
            expected += [("tokenizer_config.json", k) for k in tok_map if k not in preset.auto_map]
        assert sorted((r["file"], r["key"]) for r in res.removed_auto_map) == sorted(expected)
        new_tok = json.loads((target / "tokenizer_config.json").read_text())
        for k, v in (new_tok.get("auto_map") or {}).items():
            assert preset.auto_map[k] == v
        assert auto_map_modules(preset.auto_map) <= {p[:-3] for p in preset.files}
        assert pp.verify_pinned(target).family == family
        for rel, data in preset.files.items():
            assert (target / rel).read_bytes() == data
        # every original file is still readable with its bytes, through the overlay too
        for rel, entry in before.items():
            if entry[0] == "file" and rel not in preset.files and rel not in pp.AUTO_MAP_FILES:
                assert (target / rel).read_bytes() == (root / rel).read_bytes()
        if overlay:
            assert snap(root) == before
            assert res.mode == "overlay"
        else:
            assert pp.apply(root, family=family).action == "unchanged"
            pp.restore(root)
            assert snap(root) == before
