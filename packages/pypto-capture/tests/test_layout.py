"""layer_pattern: the layer-type pattern a report names next to the cache sizes."""

from __future__ import annotations

import pytest

from pypto_capture import layer_pattern

S, F = "sliding_attention", "full_attention"


@pytest.mark.parametrize(
    ("types_", "text"),
    [
        (([S] * 5 + [F]) * 10, "10 x (5 sliding_attention, 1 full_attention)"),
        ([S, F] * 3, "3 x (1 sliding_attention, 1 full_attention)"),
        ([F] * 4, "4 full_attention"),
        ([S] * 5 + [F], "5 sliding_attention, 1 full_attention"),
        (
            ([S] * 4 + [F]) * 2 + [S, S],
            "2 x (4 sliding_attention, 1 full_attention) + 2 sliding_attention",
        ),
        ([], "no layers"),
    ],
)
def test_layer_pattern(types_, text):
    assert layer_pattern(types_) == text
