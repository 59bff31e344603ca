"""WiSE-FT's blend of a trained student's weights with its initial ones, and the option's checks."""

from __future__ import annotations

import pytest
import torch

from distill.core.schema import InputError
from students.initial_weights import blend_with_initial, check_initial_weight_share


def test_the_blend_moves_each_float_weight_towards_its_start_and_keeps_integer_buffers() -> None:
    trained = {
        "w": torch.tensor([1.0, 3.0]),
        "h": torch.tensor([2.0], dtype=torch.float16),
        "ids": torch.tensor([5, 6]),
    }
    initial = {
        "w": torch.tensor([-1.0, 1.0]),
        "h": torch.tensor([0.0], dtype=torch.float16),
        "ids": torch.tensor([0, 1]),
    }

    assert torch.equal(blend_with_initial(trained, initial, 0.0)["w"], trained["w"])
    assert torch.equal(blend_with_initial(trained, initial, 1.0)["w"], initial["w"])
    quarter = blend_with_initial(trained, initial, 0.25)
    assert torch.equal(quarter["w"], torch.tensor([0.5, 2.5]))
    assert quarter["h"].dtype == torch.float16 and quarter["h"].item() == 1.5
    assert torch.equal(quarter["ids"], trained["ids"])


def test_weights_that_do_not_match_are_refused() -> None:
    with pytest.raises(ValueError, match="different tensors"):
        blend_with_initial({"a": torch.zeros(2)}, {"b": torch.zeros(2)}, 0.5)
    with pytest.raises(ValueError, match=r"a: trained \(2,\) against initial \(3,\)"):
        blend_with_initial({"a": torch.zeros(2)}, {"a": torch.zeros(3)}, 0.5)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        blend_with_initial({"a": torch.zeros(2)}, {"a": torch.zeros(2)}, 1.5)


@pytest.mark.parametrize(
    ("share", "head", "random_init", "message"),
    [
        (-0.1, "segment_cosine", False, "a number in"),
        (True, "segment_cosine", False, "a number in"),
        (0.5, "cls", False, "needs the segment_cosine head"),
        (0.5, "segment_cosine", True, "needs pretrained weights"),
    ],
)
def test_the_option_names_itself_when_it_cannot_apply(share, head: str, random_init: bool, message: str) -> None:
    with pytest.raises(InputError, match=f"model.initial_weight_share: .*{message}"):
        check_initial_weight_share(share, head, random_init)
    check_initial_weight_share(0.0, head, random_init)
