"""Icosphere lifting (SO(3)-RoPE seed, Sec. 3, Defs. 4-5): tokens on SO(3) and their kernels.

The equivariance of SO3ViT rests on one geometric fact, checked here for every element g of the
icosahedral group I: the set of posed tokens is closed under g. There is a token permutation
sigma with

    poses[sigma(t)] == g @ poses[t]                         (the pose moves as a point of SO(3))
    gather_index[sigma(t)] == vperm[gather_index[t]]        (tap p of t lands on tap p of sigma(t))

where ``vperm`` is the vertex permutation of g on ``icosphere(input_level)``:
``vertices[vperm[i]] == g @ vertices[i]``. Derivation of why this gives exact equivariance of the
lifting: with ``(g.x)[..., vperm[i]] = x[..., i]``, token sigma(t) of g.x reads
``(g.x)[gather[sigma(t)]] = (g.x)[vperm[gather[t]]] = x[gather[t]]``, i.e. exactly the patch token
t read from x, tap by tap; so ``embed(g.x)[sigma(t)] == embed(x)[t]``. ``vperm`` and sigma are
derived from the geometry (vertex coordinates, pose matrices), never from the model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eqvit.geometry import icosphere
from eqvit.geometry.domain import PointDomain
from eqvit.groups import get_group
from eqvit.nn.tokenizers.icosphere import IcospherePatchEmbed, IcosphereUnpatchify, icosphere_lifting

INPUT_LEVEL, PATCH_LEVEL = 3, 1


@pytest.fixture(scope="module")
def lifting():
    return icosphere_lifting(INPUT_LEVEL, PATCH_LEVEL)


@pytest.fixture(scope="module")
def group_I():
    return get_group("I")


def pose_permutation(poses: np.ndarray, g: np.ndarray, atol: float = 1e-12) -> np.ndarray | None:
    """sigma with ``poses[sigma[t]] == g @ poses[t]`` (max-abs entry error <= atol), or None."""
    moved = (g @ poses).reshape(len(poses), 9)
    flat = poses.reshape(len(poses), 9)
    err = np.abs(moved[:, None, :] - flat[None, :, :]).max(-1)  # [T, T]
    sigma = err.argmin(1)
    if err[np.arange(len(poses)), sigma].max() > atol or len(np.unique(sigma)) != len(poses):
        return None
    return sigma


def covariance_failures(poses: np.ndarray, gather: np.ndarray, group, sphere) -> list[str]:
    """The elements of ``group`` under which the posed tokens are not mapped onto posed tokens."""
    failures = []
    for e, g in enumerate(group.elements):
        vperm = sphere.vertex_permutation(g)  # from the vertex coordinates only
        sigma = pose_permutation(poses, g)
        if sigma is None:
            failures.append(f"{e}: poses not closed")
        elif not np.array_equal(gather[sigma], vperm[gather]):
            failures.append(f"{e}: kernel taps not carried along")
    return failures


# ------------------------------------------------------------------------------------------------
# the lifting geometry


def test_lifting_sizes_and_coverage(lifting):
    fine, coarse = icosphere(INPUT_LEVEL), icosphere(PATCH_LEVEL)
    assert coarse.num_faces == 80
    assert lifting.num_tokens == 3 * 80 == 240
    n = 2 ** (INPUT_LEVEL - PATCH_LEVEL)
    assert lifting.taps == (n + 1) * (n + 2) // 2 == 15
    assert lifting.gather_index.shape == (240, 15)
    assert lifting.lattice.shape == (15, 2)
    # Every vertex of the input grid is read by some token.
    assert np.array_equal(np.unique(lifting.gather_index), np.arange(fine.num_vertices))
    # Each token reads 15 distinct vertices; the 3 orientations of a patch read the same 15.
    for t in range(lifting.num_tokens):
        assert len(np.unique(lifting.gather_index[t])) == 15
    for f in range(coarse.num_faces):
        sets = {tuple(sorted(lifting.gather_index[3 * f + s])) for s in range(3)}
        assert len(sets) == 1
    # Corner taps (lattice (0,0), (n,0), (0,n)) of orientation s read the patch corners s, s+1, s+2.
    corner_taps = [int(np.flatnonzero((lifting.lattice == c).all(1))[0]) for c in ([0, 0], [n, 0], [0, n])]
    for f, face in enumerate(coarse.faces):
        for s in range(3):
            read = lifting.gather_index[3 * f + s, corner_taps]
            # Hierarchical order: coarse vertices keep their indices on the finer level.
            assert np.array_equal(read, np.roll(face, -s))


def test_poses_are_rotations_centred_on_the_patch(lifting):
    poses = lifting.poses
    assert poses.shape == (240, 3, 3) and poses.dtype == np.float64
    eye = np.broadcast_to(np.eye(3), poses.shape)
    assert np.abs(poses.transpose(0, 2, 1) @ poses - eye).max() <= 1e-12
    assert np.abs(np.linalg.det(poses) - 1).max() <= 1e-12
    coarse = icosphere(PATCH_LEVEL)
    # e3 is the patch centroid direction; e1 points (tangentially) towards the starting corner.
    centroids = np.repeat(coarse.face_centroids, 3, axis=0)
    assert np.abs(poses[:, :, 2] - centroids).max() <= 1e-12
    start = coarse.vertices[np.array([np.roll(face, -s)[0] for face in coarse.faces for s in range(3)])]
    assert np.all(np.einsum("ti,ti->t", poses[:, :, 0], start) > 0.05)
    # All 240 poses are distinct.
    assert pose_permutation(poses, np.eye(3)) is not None


def test_posed_tokens_map_onto_posed_tokens_under_I(lifting, group_I):
    assert group_I.order == 60
    sphere = icosphere(INPUT_LEVEL)
    assert covariance_failures(lifting.poses, lifting.gather_index, group_I, sphere) == []
    # sigma is a genuine, non-trivial permutation for the non-identity elements.
    sigma = pose_permutation(lifting.poses, group_I.elements[1])
    assert np.count_nonzero(sigma != np.arange(240)) == 240


def test_covariance_check_can_fail(lifting, group_I):
    """Controls: corrupting one token's kernel or one pose is detected."""
    sphere = icosphere(INPUT_LEVEL)
    sub = group_I.subgroup(np.flatnonzero(np.abs(group_I.elements[:, :, 2] - [0, 0, 1]).max(-1) < 1e-9))  # C5
    assert sub.order == 5
    gather = lifting.gather_index.copy()
    gather[7, [1, 2]] = gather[7, [2, 1]]  # swap two taps of one token only
    assert len(covariance_failures(lifting.poses, gather, sub, sphere)) == 4  # every non-identity element
    poses = lifting.poses.copy()
    poses[7] = poses[7] @ np.diag([-1.0, -1.0, 1.0])  # turn one token half-way about its own e3
    assert len(covariance_failures(poses, lifting.gather_index, sub, sphere)) == 4


def test_lifting_is_cached_and_readonly(lifting):
    assert icosphere_lifting(INPUT_LEVEL, PATCH_LEVEL) is lifting
    with pytest.raises(ValueError):
        lifting.gather_index[0, 0] = 0


# ------------------------------------------------------------------------------------------------
# the modules


def test_patch_embed_shapes():
    embed = IcospherePatchEmbed(in_chans=3, embed_dim=8, input_level=INPUT_LEVEL, patch_level=PATCH_LEVEL)
    assert embed.num_tokens == 240 and embed.num_vertices == 642
    x = torch.randn(2, 3, 642)
    assert embed(x).shape == (2, 240, 8)
    poses = embed.poses
    assert poses.shape == (240, 3, 3) and poses.dtype == torch.float64
    poses.zero_()  # a copy: the cached geometry is untouched
    assert np.abs(embed.lifting.poses).max() > 0.5


def test_unpatchify_shapes():
    head = IcosphereUnpatchify(embed_dim=8, out_chans=5, input_level=INPUT_LEVEL, patch_level=PATCH_LEVEL)
    assert head(torch.randn(2, 240, 8)).shape == (2, 5, 642)


def test_patch_level_equal_to_input_level():
    embed = IcospherePatchEmbed(2, 4, input_level=1, patch_level=1)
    assert embed.lifting.taps == 3 and embed.num_tokens == 240
    assert embed(torch.randn(1, 2, 42)).shape == (1, 240, 4)
    assert IcosphereUnpatchify(4, 2, input_level=1, patch_level=1)(torch.randn(1, 240, 4)).shape == (1, 2, 42)


@pytest.mark.parametrize("cls", [IcospherePatchEmbed, IcosphereUnpatchify])
def test_patch_level_above_input_level_is_rejected(cls):
    with pytest.raises(ValueError, match="patch_level"):
        cls(3, 8, input_level=1, patch_level=2)
    with pytest.raises(ValueError, match="patch_level"):
        icosphere_lifting(1, 2)
    with pytest.raises(ValueError, match="patch_level"):
        icosphere_lifting(2, -1)


def test_embed_and_unpatchify_are_covariant(lifting, group_I):
    """``embed(g.x)[sigma(t)] == embed(x)[t]`` and ``unpatchify(tokens o sigma^-1) == g.unpatchify``."""
    torch.manual_seed(0)
    sphere = icosphere(INPUT_LEVEL)
    domain = PointDomain(sphere.vertices)
    embed = IcospherePatchEmbed(3, 8, INPUT_LEVEL, PATCH_LEVEL).double()
    head = IcosphereUnpatchify(8, 3, INPUT_LEVEL, PATCH_LEVEL).double()
    x = torch.randn(2, 3, 642, dtype=torch.float64)
    tokens = torch.randn(2, 240, 8, dtype=torch.float64)
    with torch.no_grad():
        y, out = embed(x), head(tokens)
        for g in group_I.elements[::7]:
            sigma = torch.as_tensor(pose_permutation(lifting.poses, g))
            moved = torch.empty_like(y)
            moved[:, sigma] = y
            assert torch.allclose(embed(domain.act(g, x)), moved, rtol=0, atol=1e-13)
            moved_tokens = torch.empty_like(tokens)
            moved_tokens[:, sigma] = tokens
            assert torch.allclose(head(moved_tokens), domain.act(g, out), rtol=0, atol=1e-13)


def test_a_patch_three_tokens_read_one_lattice_turned(lifting):
    """Token (f, s) reads the vertices of token (f, 0), its lattice turned: the lifting gathers each patch once."""
    taps = lifting.orientation_taps
    assert np.array_equal(taps[0], np.arange(lifting.taps))
    per_patch = lifting.gather_index.reshape(-1, 3, lifting.taps)
    for s in (1, 2):
        assert sorted(taps[s]) == list(range(lifting.taps)) and not np.array_equal(taps[s], taps[0])
        assert np.array_equal(per_patch[:, s][:, taps[s]], per_patch[:, 0])
    assert np.array_equal(lifting.face_index, per_patch[:, 0])


def test_embed_and_unpatchify_compute_their_definitions():
    """The patch-at-once forms against one token at a time: token t is ``W x[:, gather[t]]`` (columns
    (c, p)); the unpatchify writes ``W_out token`` onto each token's taps and averages per vertex."""
    torch.manual_seed(0)
    embed = IcospherePatchEmbed(2, 5, INPUT_LEVEL, PATCH_LEVEL).double()
    head = IcosphereUnpatchify(5, 2, INPUT_LEVEL, PATCH_LEVEL).double()
    gather = torch.from_numpy(embed.lifting.gather_index.copy())  # [N, P]
    N, P = gather.shape
    x = torch.randn(3, 2, embed.num_vertices, dtype=torch.float64)
    W = embed.proj.weight.view(5, 2, P)
    expected = torch.einsum("dcp,bcnp->bnd", W, x[:, :, gather]) + embed.proj.bias
    assert (embed(x) - expected).abs().max() < 1e-12
    tokens = torch.randn(3, N, 5, dtype=torch.float64)
    values = (tokens @ head.proj.weight.T + head.proj.bias).view(3, N, 2, P)  # [B, N, C, P]
    total = torch.zeros(3, 2, embed.num_vertices, dtype=torch.float64)
    count = torch.zeros(embed.num_vertices, dtype=torch.float64)
    for t in range(N):
        total[:, :, gather[t]] += values[:, t]
        count[gather[t]] += 1
    assert (head(tokens) - total / count).abs().max() < 1e-12


def test_turned_orientations_that_disagree_are_refused():
    from eqvit.nn.tokenizers.icosphere import _orientation_taps

    gather = icosphere_lifting(INPUT_LEVEL, PATCH_LEVEL).gather_index.copy()
    gather[4, [0, 1]] = gather[4, [1, 0]]  # token (1, 1) reads two taps swapped: no longer a lattice turn
    with pytest.raises(RuntimeError, match="one lattice rotation"):
        _orientation_taps(gather)


def test_folded_unpatchify_keeps_its_average_exact_when_cast_to_float64():
    """A float32 unpatchify folded and then cast to float64 averages with exact 1/count, as the training
    form does (a float32-rounded copy is off by ~1e-8)."""
    from eqvit import fold

    torch.manual_seed(0)
    head = IcosphereUnpatchify(5, 2, INPUT_LEVEL, PATCH_LEVEL)
    folded = fold(head)
    counts = 3 * torch.bincount(head.scatter_index, minlength=head.num_vertices).double()
    assert folded.inv_count.dtype == torch.float32
    assert torch.equal(folded.double().inv_count, 1.0 / counts)
    tokens = torch.randn(2, head.lifting.num_tokens, 5, dtype=torch.float64)
    expected = head.double()(tokens)
    # round-off of float64 only (the factored form sums in another order); a float32 1/count is 1e-8 off
    assert (folded(tokens) - expected).abs().max() <= 1e-14 * expected.abs().max()
