"""Platonic molecule models: exact invariance (frames on positions, atom order) in float64, and the
fixed-key attention of the Platonic seed's App. M."""

from __future__ import annotations

import pytest
import torch
from helpers import randomise_

import eqvit
from eqvit.groups.so3 import random_rotations
from eqvit.models.molecules import FixedKeyAttention
from eqvit.models.platonic import spatial_frames
from eqvit.nn.platonic import PlatonicAttention
from eqvit.nn.posenc import FrameRoPE
from eqvit.testing import EquivarianceError, assert_equivariant


def molecules(batch: int = 3, atoms: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randn(batch, atoms, 3, generator=gen, dtype=torch.float64) * 1.5
    kinds = torch.randint(0, 5, (batch, atoms), generator=gen)
    return pos, torch.nn.functional.one_hot(kinds, 5).double()


def model(group: str, attention: str = "fixed_keys", **kw) -> torch.nn.Module:
    width = {"trivial": 48, "T": 48, "O": 48, "I": 120}[group]
    torch.manual_seed(0)
    return randomise_(
        eqvit.create_model("platonic_qm9_tiny", group=group, embed_dim=width, attention=attention, **kw)
    ).double()


@pytest.mark.parametrize("attention", ["fixed_keys", "softmax"])
@pytest.mark.parametrize("group", ["T", "O", "I"])
def test_invariant_to_the_frames_on_positions_float64(group, attention):
    m = model(group, attention, num_targets=2).eval()
    pos, atoms = molecules()
    with torch.no_grad():
        out = m(pos, atoms)
        assert out.shape == (3, 2) and out.abs().max() > 1e-3  # a silent model would make the check vacuous
        for R in spatial_frames(group).elements:
            R = torch.from_numpy(R.copy())
            err = (m(pos @ R.T, atoms) - out).abs().max() / out.abs().max()
            assert err < 1e-10
        # translations too (the positions are centred)
        assert (m(pos + torch.tensor([3.0, -1.0, 2.0], dtype=torch.float64), atoms) - out).abs().max() < 1e-10
    report = assert_equivariant(m, batch_size=2)  # the library's checker agrees
    assert group in str(report)


@pytest.mark.parametrize("group", ["trivial", "T", "I"])
def test_invariant_to_atom_order_float64(group):
    m = model(group).eval()
    pos, atoms = molecules()
    perm = torch.randperm(pos.shape[1], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = m(pos, atoms)
        assert (m(pos[:, perm], atoms[:, perm]) - out).abs().max() < 1e-10 * out.abs().max()


def test_not_invariant_to_rotations_outside_the_frames():
    """Exact invariance is to the frames only: a generic rotation changes the output (the test's
    rotations are not vacuous)."""
    m = model("T").eval()
    pos, atoms = molecules()
    R = random_rotations(1, generator=torch.Generator().manual_seed(0))[0].double()
    with torch.no_grad():
        out = m(pos, atoms)
        assert (m(pos @ R.T, atoms) - out).abs().max() > 1e-4 * out.abs().max()


def test_a_broken_model_fails_the_check():
    """Frame RoPE built on rotated frames no longer matches the group the model declares."""
    m = model("T")
    R = random_rotations(1, generator=torch.Generator().manual_seed(1))[0].double()
    with torch.no_grad():
        m.posenc.frames.copy_(R @ m.posenc.frames)
    with pytest.raises(EquivarianceError):
        assert_equivariant(m, batch_size=2)


def test_fixed_keys_are_one_constant_rotated_by_frame_rope():
    """Scores ``q_i . rho(R^-1 p_j) 1``: the explicit attention with constant keys, per frame and head."""
    torch.manual_seed(0)
    G = spatial_frames("T")
    C, H = 8, 2
    attn = FixedKeyAttention(G, C, H).double().eval()
    randomise_(attn)
    rope = FrameRoPE(G, H, C // H, min_wavelength=0.5, max_wavelength=4.0).double()
    x = torch.randn(2, 5, G.order * C, dtype=torch.float64)
    pos = torch.randn(2, 5, 3, dtype=torch.float64)
    bound = rope.bind(pos)
    got = attn(x, bound)
    # by hand: q, v from the projection; k = ones rotated; softmax(q k^T / sqrt(D)) v per frame-head
    qv = attn.head_order(attn.qkv(x)).unflatten(-1, (2, G.order * H, C // H))
    q, v = qv[:, :, 0], qv[:, :, 1]
    from eqvit.nn.posenc.frame_rope import rotate_pairs

    q = rotate_pairs(q, bound.rotation)
    k = rotate_pairs(torch.ones_like(q), bound.rotation)
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / (C // H) ** 0.5
    out = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v).reshape(2, 5, -1)
    torch.testing.assert_close(got, attn.proj(out), rtol=1e-12, atol=1e-12)
    # the keys do not depend on the content: without positions, attention is the mean of the values
    mean_v = v.mean(1, keepdim=True).expand_as(v).reshape(2, 5, -1)
    torch.testing.assert_close(attn(x, None), attn.proj(mean_v), rtol=1e-12, atol=1e-12)
    # and its projection computes q and v only: two thirds of the learned-key attention's
    assert attn.qkv.weight.numel() * 3 == PlatonicAttention(G, C, H).qkv.weight.numel() * 2


def test_options_are_checked():
    with pytest.raises(ValueError, match="attention"):
        eqvit.create_model("platonic_qm9_tiny", attention="linear")
    with pytest.raises(ValueError, match="atom_pool"):
        eqvit.create_model("platonic_qm9_tiny", atom_pool="max")
    with pytest.raises(ValueError, match="embed_dim"):
        eqvit.create_model("platonic_qm9_tiny", group="I", embed_dim=48)
    m = eqvit.create_model("platonic_qm9_tiny", group="O", num_targets=3)
    with pytest.raises(ValueError, match="fixed-key"):
        from eqvit.models.restrict import restrict

        restrict(m, "T")


def test_sum_and_mean_atom_pooling_differ_by_the_atom_count():
    torch.manual_seed(0)
    pos, atoms = molecules(atoms=9)
    summed = eqvit.create_model("platonic_qm9_tiny", atom_pool="sum").double().eval()
    mean = eqvit.create_model("platonic_qm9_tiny", atom_pool="mean").double().eval()
    mean.load_state_dict(summed.state_dict())
    tokens = summed.forward_features(pos, atoms)
    torch.testing.assert_close(summed.head.reduce_atoms(tokens) * 18.0 / 9, mean.head.reduce_atoms(tokens))
