"""Model sizes out of range are ValueErrors naming the argument, what is valid and what came, for every
registered family: no ZeroDivisionError, no torch message, no silent model."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import eqvit
from eqvit.models._checks import check_model_args
from eqvit.models.baselines import S2TransformerBaseline
from eqvit.models.dip import build_dip
from eqvit.models.molecules import build_molecule_model
from eqvit.models.o2vit import build_o2vit
from eqvit.models.platonic import build_platonic
from eqvit.models.so3vit import build_so3vit

# family prefix -> the builder whose keywords the registered entry points take
BUILDERS = {
    "o2vit": build_o2vit,
    "so3vit": build_so3vit,
    "vit_ape": build_so3vit,
    "platonic_qm9": build_molecule_model,  # before "platonic": the first matching prefix wins
    "dip_qm9": build_dip,
    "platonic": build_platonic,
    "s2transformer": S2TransformerBaseline,
}
TINY = eqvit.list_models("*tiny")

BAD = [
    ("depth", -1, "positive integer"),
    ("depth", 0, "positive integer"),
    ("depth", 2.5, "positive integer"),
    ("depth", True, "positive integer"),
    ("depth", "2", "positive integer"),
    ("num_heads", 0, "positive integer"),
    ("num_heads", -2, "positive integer"),
    ("patch_size", 0, "positive integer"),
    ("num_classes", -1, "non-negative integer"),
    ("num_classes", 1.5, "non-negative integer"),
    ("in_chans", 0, "positive integer"),
    ("out_chans", 0, "positive integer"),
    ("embed_dim", 0, "positive integer"),
    ("embed_dim", -8, "positive integer"),
    ("mlp_ratio", 0, "positive number"),
    ("mlp_ratio", -1.0, "positive number"),
    ("mlp_ratio", float("nan"), "positive number"),
    ("img_size", 0, "img_size"),
    ("regular_copies", 0, "positive integer"),
    ("input_level", -1, "non-negative integer"),
    ("num_points", 0, "positive integer"),
    ("target_width", 0, "positive integer"),
    ("drop_path_rate", -0.1, r"probability in \[0, 1\)"),
    ("attn_drop_rate", 1.5, r"probability in \[0, 1\)"),
]


def _builder(name: str):
    return next(fn for prefix, fn in BUILDERS.items() if name.startswith(prefix))


def _takes(name: str, arg: str) -> bool:
    return arg in inspect.signature(_builder(name)).parameters


def test_every_tiny_model_has_a_builder():
    for name in TINY:
        assert _builder(name) is not None, name


CASES = [(name, arg, value, valid) for name in TINY for arg, value, valid in BAD if _takes(name, arg)]


@pytest.mark.parametrize(("name", "arg", "value", "valid"), CASES, ids=[f"{n}-{a}={v!r}" for n, a, v, _ in CASES])
def test_bad_size_is_a_value_error_naming_it(name, arg, value, valid):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=valid) as info:
            eqvit.create_model(name, **{arg: value})
    message = str(info.value)
    assert arg in message and repr(value) in message, message


@pytest.mark.parametrize("name", [n for n in TINY if _takes(n, "depth")])
def test_the_issue_examples(name):
    """depth=-1 / 2.5, num_heads=0, num_classes=-1, in_chans=0, patch_size=0 where the model takes them."""
    for arg, value in [("depth", -1), ("depth", 2.5), ("num_heads", 0), ("num_classes", -1), ("in_chans", 0)]:
        if _takes(name, arg):
            with pytest.raises(ValueError, match=f"expected {arg} to be"):
                eqvit.create_model(name, **{arg: value})
    if _takes(name, "patch_size") and name != "o2vit_hex_tiny":  # the hexagonal grid has no patch_size
        with pytest.raises(ValueError, match="expected patch_size to be a positive integer"):
            eqvit.create_model(name, patch_size=0)


def test_img_size_not_a_multiple_of_patch_size():
    for name in ("o2vit_square_tiny", "platonic_image_tiny"):
        with pytest.raises(ValueError, match="img_size 10 must be a multiple of patch_size 4"):
            eqvit.create_model(name, img_size=10, patch_size=4)


def test_s2transformer_img_size_is_a_pair():
    with pytest.raises(ValueError, match=r"img_size to be a pair \(nlat, nlon\), got 16"):
        eqvit.create_model("s2transformer_tiny", img_size=16)
    with pytest.raises(ValueError, match="img_size"):
        eqvit.create_model("s2transformer_tiny", img_size=(0, 32))


def test_numpy_integers_and_defaults_are_accepted():
    check_model_args(dict(depth=np.int64(2), mlp_ratio=np.float32(2.0), embed_dim=None, num_classes=0, drop_rate=0.0))
    model = eqvit.create_model("so3vit_tiny", depth=np.int64(1))
    assert len(model.blocks) == 1
