"""A folded model's residual stream in another basis (``eqvit.nn.stream``): the reflection, the norms, a block and
the model's fold, against the nominal forms in float64."""

from __future__ import annotations

import pytest
import torch
from helpers import SCHEME_LAYOUTS, build, random_input, randomise_, scheme_layout_kwargs
from torch import nn

import eqvit
from eqvit.nn.posenc.base import PositionalScheme
from eqvit.nn.stream import LayerNormCore, StreamBasis

TOL = 1e-12


def _noised(name: str) -> nn.Module:
    torch.manual_seed(0)
    return randomise_(build(name)).double().eval()


def _uniform(dim: int) -> torch.Tensor:
    return torch.full((dim,), dim**-0.5, dtype=torch.float64)


def test_householder_maps_the_source_direction_to_the_target():
    source = torch.zeros(6, dtype=torch.float64)
    source[[0, 3]] = 0.5
    q = StreamBasis.householder(source, torch.ones(6, dtype=torch.float64)).matrix
    torch.testing.assert_close(q @ q.T, torch.eye(6, dtype=torch.float64), rtol=0, atol=TOL)
    torch.testing.assert_close(source / source.norm() @ q, _uniform(6), rtol=0, atol=TOL)
    same = StreamBasis.householder(torch.ones(4), torch.ones(4)).matrix
    assert torch.equal(same, torch.eye(4))


def test_householder_refuses_a_non_square_matrix():
    with pytest.raises(ValueError, match=r"square change of basis \[d, d\], got shape \(3, 4\)"):
        StreamBasis(torch.zeros(3, 4))


def test_the_equivariant_norm_is_layer_norm_in_its_stream_basis():
    norm = _noised("o2vit_square_tiny").blocks[0].norm1
    basis = norm.stream_basis()
    x = torch.randn(2, 5, norm.in_type.dim, dtype=torch.float64)
    y = basis.to_stream(x)
    with torch.no_grad():
        expected = norm(x)
        core, output = norm.split_in_stream(basis)
        assert isinstance(core, LayerNormCore)
        # the bare F.layer_norm, then the affine the next layer folds in
        torch.testing.assert_close(core(y) @ output.matrix + output.shift, expected, rtol=0, atol=TOL)
        # the model's final norm: its output in the stream basis too
        torch.testing.assert_close(norm.fold_in_stream(basis)(y), basis.to_stream(expected), rtol=0, atol=TOL)


def test_a_basis_that_does_not_fit_the_centre_is_refused():
    norm = _noised("o2vit_square_tiny").blocks[0].norm1
    identity = StreamBasis(torch.eye(norm.in_type.dim, dtype=torch.float64))
    assert norm.split_in_stream(identity) is None and norm.fold_in_stream(identity) is None


def test_a_block_folded_into_the_stream_computes_the_block_in_that_basis():
    model = _noised("o2vit_square_tiny")
    block, basis = model.blocks[1], model.norm.stream_basis()
    x = torch.randn(2, 7, block.in_type.dim, dtype=torch.float64)
    with torch.no_grad():
        folded = block.fold_in_stream(basis)
        torch.testing.assert_close(
            folded(basis.to_stream(x), None, 1), basis.to_stream(block(x, None, 1)), rtol=0, atol=1e-10
        )
    assert isinstance(folded.norm1, LayerNormCore) and isinstance(folded.norm2, LayerNormCore)


def test_a_block_that_cannot_fold_into_the_stream_says_so():
    schur = _noised("o2vit_d4_small_patch16_tiny")  # components layout: a dense basis would undo the Schur blocks
    assert schur.blocks[0].fold_in_stream(schur.norm.stream_basis()) is None
    dense = _noised("o2vit_square_tiny")
    block = dense.blocks[0]
    block.ls1 = nn.Linear(block.in_type.dim, block.in_type.dim).double()  # a LayerScale-like layer between
    assert block.fold_in_stream(dense.norm.stream_basis()) is None


O2_CASES = [(n, scheme_layout_kwargs(p, a)) for n, p, a in SCHEME_LAYOUTS if n.startswith("o2vit")]


@pytest.mark.parametrize(("name", "kwargs"), O2_CASES, ids=[f"{n}-{k['posenc']}-{k['attention']}" for n, k in O2_CASES])
def test_the_dense_o2_models_fold_their_stream(name, kwargs):
    """The seed-sized O(2) models (dense linears) keep their folded stream in the norms' basis, with the
    public interface of the unfolded model: the features, the logits and every intermediate map, normed or not."""
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model(name, **kwargs)).double().eval()
    folded = eqvit.fold(model)
    assert isinstance(folded.stream_basis, StreamBasis)
    assert all(isinstance(b.norm1, LayerNormCore) for b in folded.blocks)
    x = random_input(model, dtype=torch.float64)
    with torch.no_grad():
        for method in ("forward", "forward_features"):
            expected = getattr(model, method)(x)
            torch.testing.assert_close(getattr(folded, method)(x), expected, rtol=0, atol=1e-10 * expected.abs().max())
        for norm in (False, True):
            expected = model.forward_intermediates(x, norm=norm, return_prefix_tokens=True, intermediates_only=True)
            got = folded.forward_intermediates(x, norm=norm, return_prefix_tokens=True, intermediates_only=True)
            for (map_got, prefix_got), (map_expected, prefix_expected) in zip(got, expected):
                for a, b in ((map_got, map_expected), (prefix_got, prefix_expected)):
                    torch.testing.assert_close(a, b, rtol=0, atol=1e-10 * b.abs().max())


class _TrivialShift(PositionalScheme):
    """An additive scheme without ``fold_in_stream``: a fixed shift of the trivial coordinates (invariant)."""

    def __init__(self, shift: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("shift", shift)

    def add_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.shift


def test_a_layer_without_a_stream_fold_keeps_the_nominal_stream():
    ftype = build("o2vit_square_tiny").token_type
    shift = torch.zeros(ftype.dim)
    shift[ftype.trivial_index] = 0.3
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("o2vit_square_tiny", posenc=_TrivialShift(shift))).double().eval()
    folded = eqvit.fold(model)
    assert not hasattr(folded, "stream_basis")
    x = random_input(model, dtype=torch.float64)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(folded(x), expected, rtol=0, atol=1e-10 * expected.abs().max())


def test_a_wrong_stream_basis_changes_the_features():
    """The interface checks above fail on a folded model whose intermediate maps or readout map the stream back
    wrongly."""
    model = _noised("o2vit_square_tiny")
    folded = eqvit.fold(model)
    x = random_input(model, dtype=torch.float64)
    with torch.no_grad():
        folded.to_token_type.basis.matrix.copy_(torch.eye(model.embed_dim, dtype=torch.float64))
        maps = folded.forward_intermediates(x, intermediates_only=True, output_fmt="NLC")
        assert (
            maps[-1] - model.forward_intermediates(x, intermediates_only=True, output_fmt="NLC")[-1]
        ).abs().max() > 1e-3
        folded.readout.weight.copy_(folded.readout.weight.flip(0))
        assert (folded.forward_features(x) - model.forward_features(x)).abs().max() > 1e-3
