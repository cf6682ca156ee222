"""What the library may import: no test helpers."""

import ast
from pathlib import Path

import pypto_models_llada2

SRC = Path(pypto_models_llada2.__file__).resolve().parent


def test_library_code_imports_no_test_helpers():
    offenders = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            bad = [
                n for n in names if n.split(".")[0] in ("pypto_testing", "pypto_bench", "pytest")
            ]
            if bad:
                offenders[path.name] = bad
    assert offenders == {}
