"""`diff --values` on tensors `torch.save` kept as views (issue 18 §2): a stride-0 view (`torch.zeros(1).expand(N)`:
4 stored bytes for N elements) must be compared fast, in bounded memory, with the right verdict; so must a view on
one side against a plain tensor on the other, views repeating along different axes, and a transposed view.

The pair of checkpoints is the real legacy sample (megatron-core 0.16.1) with extra tensors saved by `torch.save`.
Work is counted (elements materialised for comparison), not timed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import ckptinspect.commands.diff.values as values_mod
from ckptinspect.commands.diff.diff import DiffResult, diff_paths

REPO = Path(__file__).resolve().parents[3]
LEGACY = REPO / "sample_ckpts" / "legacy"
SHARD = "mp_rank_00_000"
HUGE = 2**40  # elements of an expanded view: 4 TiB if expanded, 4 bytes stored


def _extra(torch: Any, side: str) -> dict[str, Any]:
    """The tensors added to the model state of side A and B."""
    a = side == "A"
    return {
        "same_expanded": torch.full((1,), 0.5).expand(10**8),
        "huge_expanded": torch.zeros(1).expand(HUGE),
        "expanded_differs": torch.full((1,), 0.0 if a else 2.0).expand(10**8),
        "one_side_expanded": torch.zeros(2**16) if a else torch.zeros(1).expand(2**16),
        "one_side_one_differs": torch.zeros(2**16) if a else torch.zeros(1).expand(2**16).clone().index_fill_(
            0, torch.tensor([7]), 1.0).expand(2**16),
        "rows_broadcast": torch.arange(3.0).expand(10**6, 3),
        "cross_small": torch.arange(100.0).expand(100, 100) if a else torch.arange(100.0).reshape(100, 1).expand(
            100, 100),
        "cross_huge": torch.arange(10.0**5).expand(10**5, 10**5) if a else torch.arange(10.0**5).reshape(
            10**5, 1).expand(10**5, 10**5),
        "transposed": torch.arange(12.0).reshape(3, 4).t() if a else torch.arange(12.0).reshape(3, 4).t().contiguous(),
    }


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[DiffResult, int]:
    import torch

    root = tmp_path_factory.mktemp("views")
    for side in ("A", "B"):
        shutil.copytree(LEGACY, root / side)
        target = root / side / "iter_0000001" / SHARD / "model_optim_rng.pt"
        state = torch.load(target, weights_only=False)
        state["model"].update(_extra(torch, side))
        torch.save(state, target)
    touched = [0]
    real = values_mod._values

    def counting(x: Any, kind: str) -> Any:
        touched[0] += int(x.size)
        return real(x, kind)

    values_mod._values = counting  # type: ignore[assignment]
    try:
        result = diff_paths(root / "A", root / "B", values=True)
    finally:
        values_mod._values = real  # type: ignore[assignment]
    return result, touched[0]


def _key(name: str) -> str:
    return f"{SHARD}/model.{name}"


def _change(result: DiffResult, name: str) -> Any:
    return next((c for c in result.tensors.changed if c.key == _key(name)), None)


def test_work_follows_stored_elements_not_numel(compared: tuple[DiffResult, int]) -> None:
    result, touched = compared
    assert result.values is not None
    assert result.values.elements_compared > HUGE + 2 * 10**8  # what the views stand for was counted...
    # ...while the elements materialised are the stored ones (the sample's ~150k, the plain sides, the small grids)
    assert touched < 2 * 10**6, touched


@pytest.mark.parametrize("name", ["same_expanded", "huge_expanded", "one_side_expanded", "rows_broadcast",
                                  "transposed"])
def test_identical_views_are_identical(name: str, compared: tuple[DiffResult, int]) -> None:
    result, _ = compared
    assert result.values is not None
    assert _key(name) in result.values.identical, (result.values.skipped, _change(result, name))


def test_stride0_views_with_different_values_differ_everywhere(compared: tuple[DiffResult, int]) -> None:
    c = _change(compared[0], "expanded_differs")
    assert c is not None and c.mismatched_elements == c.compared_elements == 10**8
    assert c.max_abs_diff == 2.0 and tuple(c.first_mismatch) == (0,)


def test_one_side_view_one_element_differs(compared: tuple[DiffResult, int]) -> None:
    c = _change(compared[0], "one_side_one_differs")
    assert c is not None and c.mismatched_elements == 1 and tuple(c.first_mismatch) == (7,)


def test_views_repeating_along_different_axes(compared: tuple[DiffResult, int]) -> None:
    result, _ = compared
    c = _change(result, "cross_small")  # A[i, j] = j, B[i, j] = i
    assert c is not None and c.mismatched_elements == 100 * 100 - 100 and c.compared_elements == 100 * 100
    assert result.values is not None
    skipped = dict(result.values.skipped)
    assert "repeat stored elements" in skipped[_key("cross_huge")]  # 10**10 comparisons for 2·10**5 stored
