"""The canonical invariant APE basis and the reading of state dicts written against the legacy eigh basis.

``invariant_basis`` must span exactly the invariants (the image of the group-averaged projector, built
here from its definition), be orthonormal, and be the same array on every numpy/LAPACK build: it calls
no LAPACK routine (checked by making them raise) and its layout is the documented one (checked against
the hand-derived basis of the standard representation). A state dict without ``basis_version`` holds
coefficients in this build's legacy eigh basis; loading it must give the encoding the old code computed.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import timm
import torch
from randomise import randomise_
from safetensors.torch import save_file

import eqvit
from eqvit.geometry.hexagonal import HexPatchGrid
from eqvit.geometry.points import permutations_for
from eqvit.geometry.square import square_grid
from eqvit.groups import get_group
from eqvit.models.restrict import find_subgroup
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.posenc.invariant import (
    BASIS_VERSION,
    FrameInvariantAPE,
    InvariantAPE,
    invariant_basis,
    legacy_invariant_basis,
)
from eqvit.train.checkpoint import CheckpointError, load_model_state

SQUARE_ODD, SQUARE_EVEN = square_grid(5, 5), square_grid(6, 6)  # with and without a centre point
HEX = HexPatchGrid(3, 2).patch_centers  # 19 centres: the origin, a ring of 6, a ring of 12
CASES = [
    ("D4", "D4", SQUARE_ODD),
    ("D4", "D4", SQUARE_EVEN),
    ("D4", "C4", SQUARE_ODD),
    ("D4", "D2", SQUARE_EVEN),
    ("D4", "D1[45deg]", SQUARE_ODD),
    ("D4", "C1", SQUARE_ODD),
    ("D6", "D6", HEX),
    ("D6", "C6", HEX),
    ("D6", "D3", HEX),
    ("D6", "D1[30deg]", HEX),
]
IDS = [f"{g}>{h}-{len(c)}" for g, h, c in CASES]
LAPACK = ("eigh", "eigvalsh", "eig", "eigvals", "qr", "svd", "lstsq", "solve", "inv", "pinv", "cholesky", "det")


def _group_and_perms(group: str, subgroup: str, centers: np.ndarray):
    H = find_subgroup(get_group(group), subgroup)
    return H, permutations_for(centers, H.elements)


def _projector(perms: np.ndarray, matrices: np.ndarray) -> np.ndarray:
    """``[M d, M d]`` the group average of ``p -> g . p``, ``(g . p)(perms[g, a]) = rho(g) p(a)``."""
    order, M = perms.shape
    total = 0
    for g in range(order):
        moves = np.zeros((M, M))
        moves[perms[g], np.arange(M)] = 1.0
        total = total + np.kron(moves, matrices[g])
    return total / order


@pytest.mark.parametrize(("group", "subgroup", "centers"), CASES, ids=IDS)
def test_the_basis_is_orthonormal_invariant_and_spans_the_invariants(group, subgroup, centers):
    H, perms = _group_and_perms(group, subgroup, centers)
    dims = []
    for rho in H.irreps:
        B = invariant_basis(perms, rho.matrices)
        n, M, d = len(B), len(centers), rho.dim
        assert B.shape == (n, M, d)
        flat = B.reshape(n, M * d)
        P = _projector(perms, rho.matrices)
        assert n == round(np.trace(P)) == len(legacy_invariant_basis(perms, rho.matrices))
        np.testing.assert_allclose(flat @ flat.T, np.eye(n), atol=1e-13)
        np.testing.assert_allclose(P @ flat.T, flat.T, atol=1e-13)  # in the image, and as many as its rank
        for g in range(H.order):  # p(g a) = rho(g) p(a), i.e. rho(g) p(g^-1 a) = p(a)
            np.testing.assert_allclose(B[:, perms[g]], np.einsum("ij,kmj->kmi", rho.matrices[g], B), atol=1e-13)
        dims.append(n)
    assert max(dims) > 1  # a degenerate eigenspace, where eigh's choice was arbitrary


def _expected_standard_basis(perms: np.ndarray, elements: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """The basis the construction promises for the standard representation ``rho(g) = g``, derived by hand.

    Orbits by smallest index ``a0``; the stabiliser of ``a0 != 0`` is trivial (fixed space R^2: ``e_1``,
    ``e_2``) or one reflection (fixed line through ``a0``: ``a0 / |a0|`` with the sign of ``P e_i`` for the
    first ``e_i`` not orthogonal to it); at the origin it fixes nothing. ``p(g a0) = g p(a0)``, unit norm.
    """
    vectors = []
    for a0 in range(len(centers)):
        orbit = np.unique(perms[:, a0])
        if orbit[0] != a0:
            continue
        stabiliser = np.flatnonzero(perms[:, a0] == a0)
        if len(stabiliser) == 1:  # (C1 at the origin too)
            fixed = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
        elif len(stabiliser) == 2 and np.linalg.norm(centers[a0]) > 0:
            u = centers[a0] / np.linalg.norm(centers[a0])
            first = u[np.flatnonzero(np.abs(u) > 1e-9)[0]]
            fixed = [np.sign(first) * u]
        else:
            assert np.linalg.norm(centers[a0]) == 0  # the origin, whose stabiliser holds a rotation
            fixed = []
        for v in fixed:
            p = np.zeros((len(centers), 2))
            for b in orbit:
                g = np.flatnonzero(perms[:, a0] == b)[0]
                p[b] = elements[g] @ v
            vectors.append(p / np.sqrt(len(orbit)))
    return np.array(vectors)


STANDARD = [0, 2, 5, 6]  # the hand derivation's cases: C1, or an origin (if any) fixed by a rotation


@pytest.mark.parametrize(("group", "subgroup", "centers"), [CASES[i] for i in STANDARD], ids=[IDS[i] for i in STANDARD])
def test_the_basis_of_the_standard_representation_is_the_documented_one(group, subgroup, centers):
    H, perms = _group_and_perms(group, subgroup, centers)
    B = invariant_basis(perms, H.elements)  # rho(g) = g: the irrep E1 of C4, D4 and D6
    np.testing.assert_allclose(B, _expected_standard_basis(perms, H.elements, centers), atol=1e-14)


def test_the_basis_is_bitwise_deterministic_and_uses_no_lapack(monkeypatch):
    reference = []
    for group, subgroup, centers in CASES:
        H, perms = _group_and_perms(group, subgroup, centers)
        for rho in H.irreps:
            first = invariant_basis(perms, rho.matrices)
            assert first.tobytes() == invariant_basis(perms, rho.matrices).tobytes()
            reference.append((perms, rho.matrices, first))

    def refuse(*args, **kwargs):
        raise AssertionError("a LAPACK routine decided part of the basis")

    for name in LAPACK:
        monkeypatch.setattr(np.linalg, name, refuse)
    with pytest.raises(AssertionError, match="LAPACK"):  # the patch bites: the legacy basis needs eigh
        legacy_invariant_basis(*reference[0][:2])
    for perms, matrices, first in reference:
        assert invariant_basis(perms, matrices).tobytes() == first.tobytes()


@pytest.mark.parametrize(
    ("perms", "matrices", "message"),
    [
        (np.array([[0, 1], [0, 0]]), np.stack([np.eye(1)] * 2), "permutation"),
        (np.array([[0, 1], [1, 0]]), np.stack([np.eye(1)] * 3), r"shape \[2, d, d\]"),
        (np.array([[0, 1], [1, 0]]), np.ones((2, 1, 2)), r"shape \[2, d, d\]"),
        (np.array([0.0, 1.0]), np.stack([np.eye(1)] * 2), r"integer permutations of shape \[order, M\]"),
    ],
)
def test_bad_input_is_a_value_error(perms, matrices, message):
    with pytest.raises(ValueError, match=message):
        invariant_basis(perms, matrices)


# ---------------------------------------------------------------------------------------------------
# state dicts written against the legacy basis


def _legacy_embedding(ape: InvariantAPE, coefficients: list[torch.Tensor]) -> torch.Tensor:
    """``[M, V.dim]`` the encoding the old code computed from ``coefficients`` (its ``pos_embed``): one einsum
    per irrep with the eigh basis of this build, in the irrep basis (FrameInvariantAPE: then to the frames)."""
    blocks = ape.ftype.blocks()
    parts = [torch.zeros(ape.num_tokens, width, dtype=torch.float64) for width in ape._widths]
    for n, k, _ in ape._used:
        B = torch.from_numpy(legacy_invariant_basis(ape._perms, blocks[n][1].matrices))
        parts[n] = ape.ftype.flatten_copies(torch.einsum("ck,kmd->mcd", coefficients[k].double(), B))
    p = torch.cat(parts, dim=-1)
    return p @ ape._exact_masters["to_tokens"] if isinstance(ape, FrameInvariantAPE) else p


def _legacy_coefficients(ape: InvariantAPE, p: torch.Tensor) -> list[torch.Tensor]:
    """The old code's ``pos_embed`` for the (invariant, irrep-basis) encoding ``p [M, V.dim]``."""
    blocks = ape.ftype.blocks()
    out = []
    for n, k, _ in ape._used:
        coords = torch.as_tensor(ape.ftype.block_coords(blocks[n][0]))
        B = torch.from_numpy(legacy_invariant_basis(ape._perms, blocks[n][1].matrices))
        out.append(torch.einsum("mcd,kmd->ck", p.double()[:, coords], B).to(ape.pos_embed[k].dtype))
    return out


def _legacy_state(model: torch.nn.Module, ape_name: str = "posenc") -> dict[str, torch.Tensor]:
    """``model``'s state dict as the old code would have written it: no ``basis_version``, the APE's
    coefficients in this build's legacy basis (the same encoding)."""
    state = dict(model.state_dict())
    ape = model.get_submodule(ape_name)
    del state[f"{ape_name}.basis_version"]
    with torch.no_grad():
        p = ape.embedding_reference().double()
    if isinstance(ape, FrameInvariantAPE):
        p = p @ ape._exact_masters["to_tokens"].T  # back to the irrep basis
    for k, coeff in enumerate(_legacy_coefficients(ape, p)):
        state[f"{ape_name}.pos_embed.{k}"] = coeff
    return state


def _change_of_basis(ape: InvariantAPE) -> list[np.ndarray]:
    """Per block ``B_legacy B_canonical^T`` in this build."""
    blocks = ape.ftype.blocks()
    out = []
    for n, _, _ in ape._used:
        old = legacy_invariant_basis(ape._perms, blocks[n][1].matrices)
        new = ape._exact_masters[f"basis_{n}"].numpy()
        out.append(old.reshape(len(old), -1) @ new.reshape(len(new), -1).T)
    return out


@pytest.mark.parametrize("frames", [False, True], ids=["irreps", "frames"])
def test_a_legacy_state_dict_gives_the_old_encoding(frames):
    G = get_group("D6")
    V = FeatureType.regular(G, 2)
    ape = FrameInvariantAPE(G, HEX, FeatureType.frames(G, 2)) if frames else InvariantAPE(G, HEX, V)
    assert any(not np.allclose(T, np.eye(len(T))) for T in _change_of_basis(ape))  # else the test is vacuous
    gen = torch.Generator().manual_seed(0)
    legacy = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in ape.pos_embed]
    state = {f"pos_embed.{k}": c for k, c in enumerate(legacy)}
    with pytest.warns(UserWarning, match=r"no basis_version .* exact only if this numpy/LAPACK build"):
        ape.double().load_state_dict(state, strict=True)
    assert int(ape.basis_version) == BASIS_VERSION
    torch.testing.assert_close(ape.embedding(), _legacy_embedding(ape, legacy), rtol=0, atol=1e-13)


@pytest.fixture(scope="module")
def hex_model() -> torch.nn.Module:
    return randomise_(eqvit.create_model("o2vit_hex_tiny")).eval()


def _output(model: torch.nn.Module, seed: int = 0) -> torch.Tensor:
    x = torch.randn(2, model.in_chans, *model.domain.shape, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x)


def test_a_legacy_checkpoint_loads_by_every_route_to_the_same_function(hex_model, tmp_path):
    expected = _output(hex_model)
    legacy = _legacy_state(hex_model)
    assert not all(torch.allclose(legacy[f"posenc.pos_embed.{k}"], p) for k, p in enumerate(hex_model.posenc.pos_embed))
    path = tmp_path / "legacy.safetensors"
    save_file({k: v.contiguous() for k, v in legacy.items()}, str(path))
    fresh = eqvit.create_model("o2vit_hex_tiny").eval()
    with pytest.warns(UserWarning, match="no basis_version"):
        fresh.load_state_dict(legacy, strict=True)
    torch.testing.assert_close(_output(fresh), expected, rtol=0, atol=1e-6)
    routed = eqvit.create_model("o2vit_hex_tiny").eval()
    with pytest.warns(UserWarning, match="no basis_version"):
        load_model_state(routed, {f"model.{k}": v for k, v in legacy.items()})  # eqvit's trainer and evaluation
    torch.testing.assert_close(_output(routed), expected, rtol=0, atol=1e-6)
    for create in (eqvit.create_model, timm.create_model):
        with pytest.warns(UserWarning, match="no basis_version"):
            loaded = create("o2vit_hex_tiny", checkpoint_path=str(path)).eval()
        torch.testing.assert_close(_output(loaded), expected, rtol=0, atol=1e-6)
    assert "posenc.basis_version" not in legacy  # the caller's state dict is left as it was


def test_a_legacy_state_of_a_restricted_model_is_read_in_the_subgroups_legacy_basis(hex_model):
    restricted = eqvit.restrict(hex_model.double(), "D3")
    expected = _output(restricted.float())
    legacy = _legacy_state(restricted)
    fresh = eqvit.restrict(eqvit.create_model("o2vit_hex_tiny"), "D3").eval()
    assert any(not np.allclose(T, np.eye(len(T))) for T in _change_of_basis(fresh.posenc))
    with pytest.warns(UserWarning, match="no basis_version"):
        fresh.load_state_dict(legacy, strict=True)
    torch.testing.assert_close(_output(fresh), expected, rtol=0, atol=1e-6)
    hex_model.float()


def test_a_new_state_dict_loads_strictly_without_conversion_in_any_dtype(hex_model):
    state = hex_model.state_dict()
    version = state["posenc.basis_version"]
    assert version.dtype == torch.int64 and version.shape == () and int(version) == BASIS_VERSION
    double = eqvit.create_model("o2vit_hex_tiny").double().eval()
    assert double.posenc.basis_version.dtype == torch.int64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        double.load_state_dict(state, strict=True)
        single = eqvit.create_model("o2vit_hex_tiny").eval()
        single.load_state_dict(double.state_dict(), strict=True)
    for k, p in enumerate(hex_model.posenc.pos_embed):
        assert torch.equal(single.posenc.pos_embed[k], p)
    torch.testing.assert_close(_output(single), _output(hex_model), rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:.*no basis_version")  # the blocks of the right width are converted
def test_an_unversioned_state_of_another_width_fails_with_the_usual_error(hex_model):
    legacy = _legacy_state(hex_model)
    legacy["posenc.pos_embed.0"] = torch.zeros(3, 5)
    model = eqvit.create_model("o2vit_hex_tiny")
    with pytest.raises(RuntimeError, match=r"size mismatch for posenc.pos_embed.0") as err:
        model.load_state_dict(legacy, strict=True)
    assert "Missing key" not in str(err.value)
    with pytest.raises(CheckpointError, match=r"1 tensors differ in shape, e\.g\. posenc\.pos_embed\.0") as err:
        load_model_state(model, {f"model.{k}": v for k, v in legacy.items()})
    assert "missing" not in str(err.value)


def test_an_unknown_basis_version_is_refused(hex_model):
    state = dict(hex_model.state_dict())
    state["posenc.basis_version"] = torch.tensor(BASIS_VERSION + 1)
    with pytest.raises(RuntimeError, match=rf"posenc.basis_version is {BASIS_VERSION + 1} in the state dict"):
        eqvit.create_model("o2vit_hex_tiny").load_state_dict(state, strict=True)


def test_an_explicit_basis_reads_unversioned_coefficients_as_they_are():
    G = get_group("D6")
    V = FeatureType.regular(G, 1)
    perms = permutations_for(HEX, G.elements)
    legacy = [legacy_invariant_basis(perms, rho.matrices) for _, rho, _, _ in V.blocks()]
    ape = InvariantAPE(G, HEX, V, basis=legacy).double()
    state = {f"pos_embed.{k}": torch.randn(p.shape, dtype=torch.float64) for k, p in enumerate(ape.pos_embed)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ape.load_state_dict(state, strict=True)
    for k, p in enumerate(ape.pos_embed):
        assert torch.equal(p, state[f"pos_embed.{k}"])
