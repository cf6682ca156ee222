"""What the library may import: no test helpers, and no torch for listing presets."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pypto_models_gemma4

SRC = Path(pypto_models_gemma4.__file__).resolve().parent


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_library_code_imports_no_test_helpers():
    offenders = {
        p.name: sorted(m for m in _imported_modules(p) if m.split(".")[0] == "pypto_testing")
        for p in SRC.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_listing_the_presets_does_not_import_torch_or_transformers():
    """pypto-patch (stdlib only) loads the entry points to list families: keep that cheap."""
    code = (
        "import sys, pypto_models_gemma4, pypto_models_gemma4.preset, pypto_models_gemma4.variants;"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_model_classes_load_lazily_from_the_package():
    from pypto_models_gemma4.modeling import PyptoGemma4ForConditionalGeneration

    assert pypto_models_gemma4.PyptoGemma4ForConditionalGeneration is (
        PyptoGemma4ForConditionalGeneration
    )
