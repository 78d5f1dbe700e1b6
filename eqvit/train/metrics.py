"""Quadrature-weighted errors on the sphere (torch, batched, differentiable).

Fields come as ``[..., V]`` on a point set (weights ``[V]``, e.g. icosphere vertex areas) or
``[..., nlat, nlon]`` on a lat-lon grid (weights ``[nlat, nlon]`` or ``[nlat, 1]``, e.g.
:func:`latlon_quadrature_weights`). The leading dimensions are usually ``[B, C]``.

Two errors, per sample and channel:

    Lp     = (sum_i w_i |pred_i - target_i|^p / sum_i w_i)^(1/p)                (lp_error)
    rel_Lp = (sum_i w_i |pred_i - target_i|^p)^(1/p) / (sum_i w_i |target_i|^p)^(1/p)
                                                                           (relative_lp_error)

``Lp`` is the spherical mean of the error (p = 1) and its root mean square (p = 2): the "L1 error"
and "L2 error" of torch-harmonics' shallow-water example (``torch_harmonics.examples.losses``
``L1LossS2`` / ``L2LossS2``, quadrature weights normalised to sum to 1, averaged over samples and
channels), the relative l1 / l2 of the S2Transformer paper and of the SO(3)-RoPE seed's Table 1.
``rel_Lp`` divides by the same norm of the target: ``rel_Lp = Lp(error) / Lp(target)``, the discrete
``||pred - target||_{L^p(S^2)} / ||target||_{L^p(S^2)}``. On fields normalised to unit variance
``L2(target)`` is about 1, so ``rel_L2`` is about ``L2``, while ``L1(target)`` is the mean absolute
value, about 0.8 for a field with a Gaussian-like distribution, so ``rel_L1`` is about ``L1 / 0.8``
(docs/benchmarks.md, "Shallow water at the SO(3)-RoPE seed's budget", measures both).

Classification: :func:`classification_scores` (accuracy, cross-entropy, per-class accuracy,
confusion matrix) and :func:`plot_confusion`.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "SphereErrorMap",
    "classification_scores",
    "draw_sphere_map",
    "grid_latitudes",
    "latlon_quadrature_weights",
    "lp_error",
    "map_keywords",
    "mollweide",
    "plot_confusion",
    "plot_sphere_maps",
    "polar_error_ratio",
    "relative_lp_error",
    "sphere_mesh",
    "weighted_mean",
]

_REDUCTIONS = ("none", "channel", "mean")


def latlon_quadrature_weights(nlat: int, nlon: int, grid: str = "equiangular") -> torch.Tensor:
    """Quadrature weights ``[nlat, nlon]`` (float64) of torch-harmonics' lat-lon grid, summing to 4 pi.

    ``w[i, j] = q_i * 2 pi / nlon`` with ``q_i`` the latitude weights of
    ``torch_harmonics.quadrature.precompute_latitudes`` (Clenshaw-Curtis in ``cos theta`` for
    ``"equiangular"``; they absorb the ``sin theta`` Jacobian), rows ordered as the solver's
    grid (north pole first). Same weights as ``torch_harmonics.QuadratureS2``.
    """
    from torch_harmonics.quadrature import precompute_latitudes

    if not (isinstance(nlat, int) and isinstance(nlon, int) and nlat >= 2 and nlon >= 1):
        raise ValueError(f"expected integers nlat >= 2 and nlon >= 1, got nlat={nlat!r}, nlon={nlon!r}")
    _, q = precompute_latitudes(nlat, grid=grid)
    w = q.to(torch.float64).reshape(nlat, 1) * (2 * math.pi / nlon)
    return w.expand(nlat, nlon).contiguous()


def grid_latitudes(nlat: int, grid: str = "equiangular") -> torch.Tensor:
    """Latitudes ``[nlat]`` in radians (``+pi/2`` first) of torch-harmonics' lat-lon grid rows."""
    from torch_harmonics.quadrature import precompute_latitudes

    colat, _ = precompute_latitudes(nlat, grid=grid)
    return math.pi / 2 - colat.to(torch.float64)


def _spatial_ndim(weights: torch.Tensor) -> int:
    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"expected weights as a torch.Tensor, got {type(weights).__name__}")
    if weights.ndim not in (1, 2):
        raise ValueError(
            f"expected weights of shape [V] (point set) or [nlat, nlon] / [nlat, 1] (grid), got {list(weights.shape)}"
        )
    return weights.ndim


def _check_weights(weights: torch.Tensor, spatial: tuple[int, ...]) -> None:
    if weights.ndim == 1:  # a point set: one weight per point
        ok = len(spatial) == 1 and weights.shape[0] == spatial[0]
    else:  # a grid: one weight per point, or per latitude row
        ok = len(spatial) == 2 and weights.shape[0] == spatial[0] and weights.shape[1] in (spatial[1], 1)
    if not ok:
        expected = f"[{spatial[0]}]" if len(spatial) == 1 else f"[{spatial[0]}, {spatial[1]}] or [{spatial[0]}, 1]"
        raise ValueError(
            f"expected weights of shape {expected} for fields of spatial shape {list(spatial)}, "
            f"got {list(weights.shape)}"
        )


def _split_shape(x: torch.Tensor, k: int, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if x.ndim < k:
        raise ValueError(f"expected {name} with at least {k} spatial dims, got shape {list(x.shape)}")
    return tuple(x.shape[: x.ndim - k]), tuple(x.shape[x.ndim - k :])


def weighted_mean(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Quadrature-weighted spherical mean over the spatial dims: ``sum w x / sum w``."""
    k = _spatial_ndim(weights)
    _, spatial = _split_shape(x, k, "x")
    _check_weights(weights, spatial)
    dims = tuple(range(-k, 0))
    w = weights.to(device=x.device, dtype=x.dtype)
    return (x * w).sum(dim=dims) / w.expand(spatial).sum()


def _lp_sums(
    pred: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    p: float,
    dims: tuple[int, ...] | None,
    reduction: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked inputs -> ``(sum_i w_i |pred_i - target_i|^p, weights in pred's dtype)`` over the spatial dims."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {list(_REDUCTIONS)}")
    if not p >= 1:
        raise ValueError(f"expected p >= 1, got {p!r}")
    if pred.shape != target.shape:
        raise ValueError(f"expected pred and target of the same shape, got {list(pred.shape)} and {list(target.shape)}")
    k = _spatial_ndim(weights)
    if dims is not None:
        expected = tuple(range(-k, 0))
        if tuple(d - pred.ndim if d >= 0 else d for d in dims) != expected:
            raise ValueError(
                f"expected dims {expected} (the trailing dims matching weights {list(weights.shape)}), "
                f"got {tuple(dims)}"
            )
    lead, spatial = _split_shape(pred, k, "pred")
    _check_weights(weights, spatial)
    if reduction == "channel" and len(lead) < 1:
        raise ValueError(
            f"reduction='channel' needs a channel dim before the spatial dims, got shape {list(pred.shape)}"
        )
    w = weights.to(device=pred.device, dtype=pred.dtype).expand(spatial)
    return ((pred - target).abs() ** p * w).sum(dim=tuple(range(-k, 0))), w


def _reduce(err: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return err
    if reduction == "channel":
        return err.reshape(-1, err.shape[-1]).mean(dim=0)
    return err.mean()


def relative_lp_error(
    pred: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    p: float = 2,
    dims: tuple[int, ...] | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Relative quadrature-weighted L^p error, per sample and channel (``rel_Lp`` of the module docstring).

    Args:
        pred, target: ``[..., V]`` or ``[..., nlat, nlon]``, usually ``[B, C, ...]``.
        weights: ``[V]`` (point set) or ``[nlat, nlon]`` / ``[nlat, 1]`` (grid).
        p: the exponent (1 or 2 in the benchmark; any ``p >= 1``).
        dims: the spatial dims (negative, trailing); default: the last ``weights.ndim``.
        reduction: ``"none"`` -> the leading shape (``[B, C]``); ``"channel"`` -> ``[C]``
            (mean over every leading dim but the last); ``"mean"`` -> scalar, the mean of
            the per-channel values.
    """
    num, w = _lp_sums(pred, target, weights, p, dims, reduction)
    den = (target.abs() ** p * w).sum(dim=tuple(range(-w.ndim, 0)))
    return _reduce((num / den.clamp_min(torch.finfo(den.dtype).tiny)) ** (1.0 / p), reduction)


def lp_error(
    pred: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    p: float = 2,
    dims: tuple[int, ...] | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Quadrature-weighted L^p error, per sample and channel: ``(sum w |pred - target|^p / sum w)^(1/p)``.

    torch-harmonics' ``L1LossS2`` (p = 1) and ``L2LossS2`` (p = 2), the seed's l1 / l2 (module
    docstring). Arguments as :func:`relative_lp_error`; the weights' scale does not matter.
    """
    num, w = _lp_sums(pred, target, weights, p, dims, reduction)
    return _reduce((num / w.sum()) ** (1.0 / p), reduction)


class SphereErrorMap:
    """Per-point error averaged over every sample (and channel) seen.

    ``update(pred, target)`` with ``[B, C, V]`` or ``[B, C, nlat, nlon]``;
    ``compute()`` -> ``[V]`` / ``[nlat, nlon]`` (``per_channel=True``: ``[C, V]`` /
    ``[C, nlat, nlon]``), float64. ``kind="abs"`` averages ``|pred - target|``,
    ``kind="squared"`` averages ``(pred - target)^2``.
    """

    def __init__(self, kind: str = "abs", per_channel: bool = False):
        if kind not in ("abs", "squared"):
            raise ValueError(f"unknown kind {kind!r}; expected 'abs' or 'squared'")
        self.kind = kind
        self.per_channel = per_channel
        self.reset()

    def reset(self) -> None:
        self._sum: torch.Tensor | None = None
        self._count = 0
        self._shape: tuple[int, ...] | None = None

    @torch.no_grad()
    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        if pred.shape != target.shape:
            raise ValueError(
                f"expected pred and target of the same shape, got {list(pred.shape)} and {list(target.shape)}"
            )
        if pred.ndim not in (3, 4):
            raise ValueError(f"expected [B, C, V] or [B, C, nlat, nlon], got {list(pred.shape)}")
        if self._shape is not None and tuple(pred.shape[1:]) != self._shape:
            raise ValueError(f"expected samples of shape {list(self._shape)} as before, got {list(pred.shape[1:])}")
        diff = (pred.detach().to(torch.float64) - target.detach().to(torch.float64)).abs()
        if self.kind == "squared":
            diff = diff * diff
        total = diff.sum(dim=0)  # [C, ...]
        self._sum = total if self._sum is None else self._sum + total
        self._count += pred.shape[0]
        self._shape = tuple(pred.shape[1:])

    def compute(self) -> torch.Tensor:
        if self._sum is None:
            raise ValueError("expected at least one update() before compute(), got none")
        mean = self._sum / self._count
        return mean if self.per_channel else mean.mean(dim=0)


def _latitudes_for(error_map: torch.Tensor, points_or_latitudes: torch.Tensor) -> torch.Tensor:
    loc = points_or_latitudes.to(device=error_map.device, dtype=torch.float64)
    if error_map.ndim == 1:
        n = error_map.shape[0]
        if loc.shape == (n, 3):
            return torch.asin((loc[:, 2] / loc.norm(dim=1)).clamp(-1.0, 1.0))
        if loc.shape == (n,):
            return loc
        raise ValueError(
            f"expected points [{n}, 3] or latitudes [{n}] for an error map of shape [{n}], got {list(loc.shape)}"
        )
    nlat, nlon = error_map.shape
    if loc.shape == (nlat * nlon, 3):
        return torch.asin((loc[:, 2] / loc.norm(dim=1)).clamp(-1.0, 1.0)).reshape(nlat, nlon)
    if loc.shape == (nlat,):
        return loc.reshape(nlat, 1).expand(nlat, nlon)
    if loc.shape in ((nlat, 1), (nlat, nlon)):
        return loc.expand(nlat, nlon)
    raise ValueError(
        f"expected points [{nlat * nlon}, 3] or latitudes [{nlat}] / [{nlat}, 1] / [{nlat}, {nlon}] "
        f"for an error map of shape [{nlat}, {nlon}], got {list(loc.shape)}"
    )


def polar_error_ratio(
    error_map: torch.Tensor,
    points_or_latitudes: torch.Tensor,
    weights: torch.Tensor,
    polar_lat_deg: float = 60.0,
) -> torch.Tensor:
    """Weighted mean error poleward of ``|latitude| > polar_lat_deg`` over the weighted global mean.

    Args:
        error_map: ``[V]`` (point set) or ``[nlat, nlon]`` (grid), e.g. ``SphereErrorMap.compute()``.
        points_or_latitudes: unit vectors ``[V, 3]`` (latitude ``asin z``) or ``[nlat * nlon, 3]``
            for a grid, or latitudes in radians ``[V]`` / ``[nlat]`` / ``[nlat, 1]`` / ``[nlat, nlon]``.
        weights: quadrature weights ``[V]`` or ``[nlat, nlon]`` / ``[nlat, 1]``.

    Returns a scalar: 1 for an error spread evenly over the sphere, > 1 when it piles up at the
    poles (the S2Transformer's failure mode in Fig. 3 of the SO(3)-RoPE paper).
    """
    if error_map.ndim not in (1, 2):
        raise ValueError(f"expected an error map [V] or [nlat, nlon], got {list(error_map.shape)}")
    if _spatial_ndim(weights) != error_map.ndim:
        raise ValueError(
            f"expected weights with {error_map.ndim} dims for an error map of shape "
            f"{list(error_map.shape)}, got {list(weights.shape)}"
        )
    _check_weights(weights, tuple(error_map.shape))
    lat = _latitudes_for(error_map, points_or_latitudes)
    w = weights.to(device=error_map.device, dtype=error_map.dtype).expand(error_map.shape)
    polar = lat.abs() > math.radians(polar_lat_deg)
    if not bool(polar.any()):
        raise ValueError(f"expected some points poleward of |latitude| > {polar_lat_deg} deg, got none")
    polar = polar.to(error_map.dtype)
    polar_mean = (error_map * w * polar).sum() / (w * polar).sum()
    global_mean = (error_map * w).sum() / w.sum()
    return polar_mean / global_mean


def classification_scores(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> dict:
    """``accuracy``, ``val_loss`` (mean cross-entropy), ``per_class_accuracy`` (list; None for a class
    without samples) and ``confusion`` (``[K, K]`` int64 tensor, rows = true class) of ``logits [N, K]``."""
    if logits.ndim != 2 or logits.shape[1] != num_classes or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits [N, {num_classes}] and labels [N], got {list(logits.shape)} and {list(labels.shape)}"
        )
    labels = labels.to(torch.long)
    pred = logits.argmax(dim=1)
    confusion = torch.bincount(labels * num_classes + pred, minlength=num_classes**2).reshape(num_classes, num_classes)
    per_class = confusion.diag().double() / confusion.sum(dim=1).double()
    return {
        "accuracy": (pred == labels).double().mean().item(),
        "val_loss": torch.nn.functional.cross_entropy(logits.double(), labels).item(),
        "per_class_accuracy": [None if v != v else v for v in per_class.tolist()],
        "confusion": confusion,
    }


def plot_confusion(confusion: torch.Tensor, classes: list[str], path, title: str) -> None:
    """Row-normalised confusion matrix (true class down, predicted across) as an image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(classes)
    rates = confusion.double() / confusion.sum(dim=1, keepdim=True).clamp_min(1).double()
    side = min(12.0, 3.0 + 0.3 * k)
    fig, ax = plt.subplots(figsize=(side + 1, side))
    im = ax.imshow(rates.numpy(), cmap="viridis", vmin=0, vmax=1)
    if k <= 40:
        ax.set_xticks(range(k), classes, rotation=90, fontsize=7)
        ax.set_yticks(range(k), classes, fontsize=7)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="fraction of the true class")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------- sphere maps


def sphere_mesh(points: torch.Tensor):
    """Triangles ``[F, 3]`` (int64 numpy) on unit vectors ``points [V, 3]``: the icosphere's own faces
    when ``points`` are an icosphere's vertices, else the convex hull (the spherical Delaunay mesh)."""
    import numpy as np

    from eqvit.geometry.icosphere import icosphere

    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != 3 or len(p) < 4:
        raise ValueError(f"expected points [V, 3] with V >= 4, got {list(p.shape)}")
    level = round(math.log(max(len(p) - 2, 1) / 10, 4)) if len(p) > 12 else 0
    if 0 <= level <= 8 and 10 * 4**level + 2 == len(p):
        sphere = icosphere(level)
        if np.allclose(sphere.vertices, p, atol=1e-9):
            return np.asarray(sphere.faces, dtype=np.int64)
    from scipy.spatial import ConvexHull

    return np.asarray(ConvexHull(p).simplices, dtype=np.int64)


def _mesh_lonlat(points, faces):
    """Per-triangle corner longitudes/latitudes ``[F', 3]`` (radians) and the face index of each,
    cut at the date line: a triangle that straddles it is drawn twice, shifted by +-2 pi (the axes
    clip the overhang); a pole corner takes its neighbours' mean longitude, so polar caps are not smeared."""
    import numpy as np

    p = np.asarray(points, dtype=np.float64)[faces]  # [F, 3, 3]
    lat = np.arcsin(np.clip(p[..., 2], -1.0, 1.0))
    lon = np.arctan2(p[..., 1], p[..., 0])
    at_pole = np.abs(p[..., 2]) > 1 - 1e-12
    first = np.argmin(at_pole, axis=1)  # the first corner that is not a pole (a pole's longitude means nothing)
    ref = np.take_along_axis(lon, first[:, None], axis=1)
    lon = ref + (lon - ref + np.pi) % (2 * np.pi) - np.pi  # unwrap each triangle around that corner
    if at_pole.any():
        rows = np.flatnonzero(at_pole.any(1))
        for r in rows:
            others = lon[r, ~at_pole[r]]
            lon[r, at_pole[r]] = others.mean() if len(others) else 0.0
    index = np.arange(len(faces))
    over = lon.max(1) > np.pi
    under = lon.min(1) < -np.pi
    lons = [lon, lon[over] - 2 * np.pi, lon[under] + 2 * np.pi]
    lats = [lat, lat[over], lat[under]]
    return np.concatenate(lons), np.concatenate(lats), np.concatenate([index, index[over], index[under]])


def mollweide(lon, lat):
    """Mollweide (equal-area) coordinates ``(x, y)`` of longitudes/latitudes in radians (numpy, any shape);
    the map is the ellipse ``(x / 2 sqrt 2)^2 + (y / sqrt 2)^2 <= 1``."""
    import numpy as np

    lon, lat = np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64)
    theta = lat.copy()
    target = np.pi * np.sin(lat)
    for _ in range(30):  # Newton on 2 theta + sin 2 theta = pi sin(lat); the poles stay at +-pi/2
        denom = 2 + 2 * np.cos(2 * theta)
        ok = denom > 1e-12
        theta = np.where(ok, theta - (2 * theta + np.sin(2 * theta) - target) / np.where(ok, denom, 1.0), theta)
    return 2 * np.sqrt(2) / np.pi * lon * np.cos(theta), np.sqrt(2) * np.sin(theta)


def _mollweide_frame(ax):
    """Ellipse outline, a 30-degree graticule and no axes; returns the ellipse to clip the field to."""
    import numpy as np
    from matplotlib.patches import Ellipse

    for lat in np.radians(np.arange(-60, 61, 30)):
        x, y = mollweide(np.linspace(-np.pi, np.pi, 90), np.full(90, lat))
        ax.plot(x, y, color="0.75", lw=0.3, zorder=3)
    for lon in np.radians(np.arange(-150, 151, 30)):
        x, y = mollweide(np.full(90, lon), np.linspace(-np.pi / 2, np.pi / 2, 90))
        ax.plot(x, y, color="0.75", lw=0.3, zorder=3)
    edge = Ellipse((0, 0), 4 * np.sqrt(2), 2 * np.sqrt(2), fill=False, lw=0.8, color="0.2", zorder=4)
    ax.add_patch(edge)
    ax.set_xlim(-2 * np.sqrt(2) * 1.01, 2 * np.sqrt(2) * 1.01)
    ax.set_ylim(-np.sqrt(2) * 1.02, np.sqrt(2) * 1.02)
    ax.set_aspect("equal")
    ax.axis("off")
    return edge


def draw_sphere_map(ax, values, *, points=None, faces=None, latitudes=None, norm=None, cmap: str = "magma"):
    """Draw one field on plain axes ``ax`` in the Mollweide (equal-area) projection; returns the artist.

    ``values [V]`` on ``points [V, 3]``: filled triangles (``faces``, default :func:`sphere_mesh`), each
    coloured by the mean of its corners. ``values [nlat, nlon]`` on an equiangular grid (``latitudes
    [nlat]`` in radians, longitudes ``2 pi j / nlon``): every cell filled. The projection is done here
    in numpy (matplotlib's geo axes transform each of 20,000 triangles separately: 30 s a map).
    """
    import numpy as np
    from matplotlib.tri import Triangulation

    v = np.asarray(values, dtype=np.float64)
    edge = _mollweide_frame(ax)
    if v.ndim == 1:
        if points is None:
            raise ValueError("expected points [V, 3] for a map of shape [V], got none")
        if len(points) != len(v):
            raise ValueError(
                f"expected points [{len(v)}, 3] for a map of shape [{len(v)}], got {list(np.shape(points))}"
            )
        faces = sphere_mesh(points) if faces is None else np.asarray(faces)
        lon, lat, index = _mesh_lonlat(points, faces)
        x, y = mollweide(lon, lat)
        tri = Triangulation(x.ravel(), y.ravel(), np.arange(x.size).reshape(-1, 3))
        artist = ax.tripcolor(
            tri, facecolors=v[faces].mean(1)[index], cmap=cmap, norm=norm, edgecolors="none", antialiased=False
        )
    elif v.ndim == 2:
        nlat, nlon = v.shape
        lat = None if latitudes is None else np.asarray(latitudes, dtype=np.float64).reshape(-1)
        if lat is None or lat.shape != (nlat,):
            raise ValueError(f"expected latitudes [{nlat}] for a map of shape [{nlat}, {nlon}], got {latitudes!r}")
        lon = 2 * np.pi * np.arange(nlon) / nlon
        lon = np.where(lon >= np.pi, lon - 2 * np.pi, lon)
        order = np.argsort(lon)
        lon, v = lon[order], v[:, order]
        lon, v = np.append(lon, lon[0] + 2 * np.pi), np.concatenate([v, v[:, :1]], axis=1)  # wrap: no gap at the rim
        step = 2 * np.pi / nlon
        lon_edges = np.append(lon - step / 2, lon[-1] + step / 2)
        mid = (lat[:-1] + lat[1:]) / 2
        lat_edges = np.concatenate([[lat[0] + (lat[0] - mid[0])], mid, [lat[-1] + (lat[-1] - mid[-1])]])
        lat_edges = np.clip(lat_edges, -np.pi / 2, np.pi / 2)
        x, y = mollweide(*np.meshgrid(lon_edges, lat_edges))
        artist = ax.pcolormesh(x, y, v, cmap=cmap, norm=norm, shading="flat")
    else:
        raise ValueError(f"expected a map [V] or [nlat, nlon], got shape {list(v.shape)}")
    artist.set_clip_path(edge)
    return artist


def map_keywords(values) -> dict:
    """Where a stored map lives, from its shape alone: ``[V]`` with ``V = 10 * 4^L + 2`` -> the vertices of
    ``icosphere(L)`` (``points``); ``[nlat, nlon]`` -> torch-harmonics' equiangular grid (``latitudes``)."""
    import numpy as np

    from eqvit.geometry.icosphere import icosphere

    shape = np.shape(values)
    if len(shape) == 2:
        return {"latitudes": grid_latitudes(shape[0]).numpy()}
    if len(shape) == 1 and shape[0] > 12:
        level = round(math.log((shape[0] - 2) / 10, 4))
        if 10 * 4**level + 2 == shape[0]:
            return {"points": np.asarray(icosphere(level).vertices)}
    raise ValueError(
        f"expected a map on an icosphere's vertices [10 * 4^L + 2] or a grid [nlat, nlon], got {list(shape)}"
    )


def plot_sphere_maps(
    panels,
    path,
    *,
    title: str | None = None,
    label: str = "mean |error| (normalised units)",
    cols: int | None = None,
    vmax: float | None = None,
) -> None:
    """Several sphere maps in one figure, Mollweide, one shared colour scale (0 .. ``vmax``, default the
    largest 99th percentile of the panels).

    ``panels``: a list of dicts with ``title``, ``values`` and the keywords of :func:`draw_sphere_map`
    (``points``/``faces`` for point sets, ``latitudes`` for grids).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import Normalize

    if not panels:
        raise ValueError("expected at least one map panel, got none")
    if vmax is None:
        vmax = max(float(np.nanpercentile(np.asarray(p["values"], dtype=np.float64), 99)) for p in panels)
    vmax = vmax if np.isfinite(vmax) and vmax > 0 else 1.0
    norm = Normalize(vmin=0.0, vmax=vmax)
    cols = cols or min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig = plt.figure(figsize=(4.6 * cols, 2.6 * rows + 0.7), layout="constrained")
    axes = []
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        keywords = {k: panel[k] for k in ("points", "faces", "latitudes") if k in panel} or map_keywords(
            panel["values"]
        )
        artist = draw_sphere_map(ax, panel["values"], norm=norm, **keywords)
        ax.set_title(panel.get("title", ""), fontsize=9)
        axes.append(ax)
    fig.colorbar(artist, ax=axes, label=label, shrink=0.85, extend="max")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=130)
    plt.close(fig)
