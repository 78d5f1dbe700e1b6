"""Domains: point sets that models read fields on, with the group action on those fields."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def parameter_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype of ``module``'s first floating-point parameter (in ``module.parameters()`` order): the dtype
    its inputs must have."""
    for param in module.parameters():
        if param.is_floating_point():
            return param.dtype
    return None


def check_dtype(x: torch.Tensor, dtype: torch.dtype | None, what: str = "input") -> None:
    """ValueError unless ``x`` is floating point and of ``dtype`` (the model's parameter dtype).

    Under ``torch.autocast`` on ``x``'s device, the autocast dtype (bf16) is accepted as well.
    """
    if dtype is None or x.dtype == dtype:
        return
    if not x.is_floating_point():
        raise ValueError(
            f"expected a floating-point {what} of dtype {_name(dtype)} (the model's parameter dtype), "
            f"got {_name(x.dtype)}; cast it with .to(torch.{_name(dtype)})"
        )
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.dtype == torch.get_autocast_dtype(device):
        return
    raise ValueError(
        f"expected {what} of dtype {_name(dtype)} (the model's parameter dtype), got {_name(x.dtype)}; cast "
        f"{'the input' if what == 'input' else what} with .to(torch.{_name(dtype)}) or the model with "
        f".to(torch.{_name(x.dtype)})"
    )


class PointDomain:
    """Scalar fields on a finite point set that a group of orthogonal matrices permutes.

    A field is a tensor whose trailing ``len(shape)`` axes index the points in row-major order
    (``shape = (V,)`` for the icosphere, ``(H, W)`` for images). The action of g is
    ``(g . f)(p) = f(g^-1 p)``, i.e. the value at point i moves to point ``perm[i]`` where
    ``points[perm[i]] = g @ points[i]``.

    Args:
        points: ``[P, d]`` float64 point coordinates.
        shape: trailing tensor shape indexing the points (``prod(shape) == P``).
        name: description used in error messages, e.g. ``"icosphere level 5"``.
        weights: optional quadrature weights, ``prod(shape)`` values in point order.
    """

    def __init__(
        self,
        points: np.ndarray,
        shape: tuple[int, ...] | None = None,
        name: str = "domain",
        weights: np.ndarray | None = None,
    ) -> None:
        self.points = np.asarray(points, dtype=np.float64)
        # Quadrature weights (e.g. icosphere vertex areas), reshaped like the fields; optional.
        self.weights = None if weights is None else np.asarray(weights, dtype=np.float64)
        self.shape = tuple(shape) if shape is not None else (len(self.points),)
        if int(np.prod(self.shape)) != len(self.points):
            raise ValueError(f"shape {self.shape} does not hold {len(self.points)} points")
        self.name = name
        self._permutation = lru_cache(maxsize=256)(self._compute_permutation)

    def __repr__(self) -> str:
        return f"PointDomain({self.name}, points={len(self.points)}, shape={self.shape})"

    def __getstate__(self) -> dict:
        # the per-instance cache wraps a bound method, which pickle cannot store; it is rebuilt empty
        state = dict(self.__dict__)
        del state["_permutation"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._permutation = lru_cache(maxsize=256)(self._compute_permutation)

    @property
    def dim(self) -> int:
        """d, the dimension of the points (2 for images and hexagonal grids, 3 for the sphere)."""
        return self.points.shape[1]

    def _compute_permutation(self, key: bytes) -> np.ndarray:
        from eqvit.geometry.points import point_permutation

        d = self.points.shape[1]
        return point_permutation(self.points, np.frombuffer(key, dtype=np.float64).reshape(d, d))

    def permutation(self, matrix: np.ndarray) -> np.ndarray:
        """int64 ``[P]`` with ``points[perm[i]] == matrix @ points[i]`` (cached per matrix)."""
        return self._permutation(np.ascontiguousarray(matrix, dtype=np.float64).tobytes())

    def check(self, x: torch.Tensor, channels: int | None = None, dtype: torch.dtype | None = None) -> None:
        """ValueError unless ``x`` is ``[B, channels, *shape]`` (and of ``dtype``, see :func:`check_dtype`)."""
        expected = ["B", channels if channels is not None else "C", *self.shape]
        ok = x.ndim == len(expected) and tuple(x.shape[2:]) == self.shape
        ok = ok and (channels is None or x.shape[1] == channels)
        if not ok:
            shown = ", ".join(str(s) for s in expected)
            raise ValueError(f"expected input of shape [{shown}] on {self.name}, got {list(x.shape)}")
        check_dtype(x, dtype)

    def describe_input(self, channels: int | str = "C") -> str:
        """The input layout in words, e.g. ``[B, 3, 10242] on icosphere level 5``."""
        return f"[B, {channels}, {', '.join(str(s) for s in self.shape)}] on {self.name}"

    def random_input(
        self, batch: int, channels: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """Standard normal fields ``[batch, channels, *shape]`` (what tests and benchmarks feed)."""
        return torch.randn(batch, channels, *self.shape, generator=generator, dtype=torch.float64).to(dtype)

    def act(self, matrix: np.ndarray, x: torch.Tensor) -> torch.Tensor:
        """Apply the group element ``matrix`` to the field ``x [..., *shape]``."""
        perm = torch.as_tensor(self.permutation(matrix), device=x.device)
        flat = x.reshape(*x.shape[: x.ndim - len(self.shape)], -1)
        out = torch.empty_like(flat)
        out[..., perm] = flat
        return out.reshape(x.shape)


class PointCloudDomain:
    """Point clouds: inputs are ``(pos [B, N, d], feat [B, N, C])``; models are called ``model(pos, feat)``.

    An orthogonal matrix g acts on the positions only, ``pos -> pos g^T`` (features are scalars).
    Point order carries no information, so there is no ``points`` array: the cloud is the input.

    Args:
        dim: d, the dimension of the positions (3 for 3-D point clouds).
        num_points: N used by :meth:`random_input`.
    """

    def __init__(self, dim: int = 3, num_points: int = 64) -> None:
        self.dim, self.num_points = dim, num_points
        self.name = f"{dim}-D point clouds"

    def __repr__(self) -> str:
        return f"PointCloudDomain(dim={self.dim})"

    def describe_input(self, channels: int | str = "C") -> str:
        return f"pos [B, N, {self.dim}], feat [B, N, {channels}] ({self.name})"

    def check(
        self, inputs: tuple[torch.Tensor, torch.Tensor], channels: int | None = None, dtype: torch.dtype | None = None
    ) -> None:
        """ValueError unless ``inputs`` is ``(pos [B, N, d], feat [B, N, channels])`` with N >= 1 (and of
        ``dtype``, see :func:`check_dtype`)."""
        pos, feat = inputs
        c = channels if channels is not None else "C"
        ok = pos.ndim == 3 and pos.shape[-1] == self.dim and feat.ndim == 3 and feat.shape[:2] == pos.shape[:2]
        ok = ok and (channels is None or feat.shape[-1] == channels)
        if not ok:
            raise ValueError(
                f"expected pos [B, N, {self.dim}] and feat [B, N, {c}], got {list(pos.shape)} and {list(feat.shape)}"
            )
        if pos.shape[1] == 0:  # the centroid of no points is NaN: the logits would be NaN
            raise ValueError(f"expected at least one point per cloud (N >= 1), got pos {list(pos.shape)}")
        check_dtype(pos, dtype, "pos")
        check_dtype(feat, dtype, "feat")

    def random_input(
        self, batch: int, channels: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Standard normal positions ``[batch, N, d]`` and features ``[batch, N, channels]``."""
        pos = torch.randn(batch, self.num_points, self.dim, generator=generator, dtype=torch.float64)
        feat = torch.randn(batch, self.num_points, channels, generator=generator, dtype=torch.float64)
        return pos.to(dtype), feat.to(dtype)

    def act(self, matrix: np.ndarray, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate (or reflect) every position by ``matrix``; features are unchanged."""
        pos, feat = inputs
        return pos @ torch.as_tensor(np.array(matrix), dtype=pos.dtype, device=pos.device).T, feat


class TokenMap:
    """Patch tokens laid out as a map: ``points [M, 2]`` (the patch centres, in token order) sitting at the
    cells ``cells [M]`` (row-major) of an array of ``shape``; the other cells are empty (zero).

    Square patches fill their grid (``cells`` all of it, in order). Hexagonal patch centres sit in axial
    coordinates: a ``(2r + 1) x (2r + 1)`` parallelogram holding the hexagon of radius r, the cells outside
    it empty. :meth:`to_map` lays tokens out, :meth:`act` moves a map by a group element (the tokens as
    points of :attr:`points`; empty cells stay empty).

    Args:
        points: ``[M, 2]`` float64 patch centres.
        shape: the map's spatial shape.
        cells: ``[M]`` flat cell of every token (default: ``arange(M)``, a full grid in token order).
        name: description used in error messages.
        reduction: input pixels per map step (timm's ``feature_info`` ``reduction``).
    """

    def __init__(
        self,
        points: np.ndarray,
        shape: tuple[int, ...],
        cells: np.ndarray | None = None,
        name: str = "token map",
        reduction: int = 1,
    ) -> None:
        self.tokens = PointDomain(points, name=name)
        self.points, self.shape, self.name, self.reduction = self.tokens.points, tuple(shape), name, int(reduction)
        size = int(np.prod(self.shape))
        self.cells = np.arange(len(self.points)) if cells is None else np.asarray(cells, dtype=np.int64)
        if len(self.cells) != len(self.points) or len(np.unique(self.cells)) != len(self.cells):
            raise ValueError(f"expected one distinct cell per token ({len(self.points)}), got {len(self.cells)}")
        if self.cells.size and not 0 <= self.cells.min() <= self.cells.max() < size:
            raise ValueError(f"cells must lie in [0, {size}) for a map of shape {list(self.shape)}")
        self.full = size == len(self.points) and np.array_equal(self.cells, np.arange(size))

    def __repr__(self) -> str:
        return f"TokenMap({self.name}, tokens={len(self.points)}, shape={self.shape})"

    def to_map(self, values: torch.Tensor) -> torch.Tensor:
        """``values [..., M]`` (token order) -> ``[..., *shape]``, empty cells zero."""
        if self.full:
            return values.reshape(*values.shape[:-1], *self.shape)
        cells = torch.as_tensor(self.cells, device=values.device)
        flat = values.new_zeros(*values.shape[:-1], int(np.prod(self.shape)))
        return flat.index_copy(-1, cells, values).reshape(*values.shape[:-1], *self.shape)

    def from_map(self, fmap: torch.Tensor) -> torch.Tensor:
        """``fmap [..., *shape] -> [..., M]``: the tokens' cells, in token order."""
        flat = fmap.reshape(*fmap.shape[: fmap.ndim - len(self.shape)], -1)
        return flat if self.full else flat[..., torch.as_tensor(self.cells, device=fmap.device)]

    def act(self, matrix: np.ndarray, fmap: torch.Tensor) -> torch.Tensor:
        """The group element ``matrix`` moving the tokens of ``fmap [..., *shape]`` as points of :attr:`points`."""
        return self.to_map(self.tokens.act(matrix, self.from_map(fmap)))


def symmetry_subgroup(group, points: np.ndarray):
    """The subgroup of ``group`` (a :class:`~eqvit.groups.FiniteGroup`) whose elements map ``points [P, d]``
    onto themselves: ``group`` itself when all do (e.g. the half turn and the axis reflections of D6 on a
    square pixel grid)."""
    from eqvit.geometry.points import PointIndex

    index = PointIndex(np.asarray(points, dtype=np.float64))
    kept = [g for g, matrix in enumerate(group.elements) if index.maps_onto_itself(matrix)]
    return group if len(kept) == group.order else group.subgroup(np.asarray(kept))


def require_action(group, points: np.ndarray, what: str) -> None:
    """ValueError unless every element of ``group`` maps ``points [P, d]`` onto themselves, naming the first
    element that does not (``C8 does not map the square patch grid onto itself: element 1, rot 45.0deg``)."""
    from eqvit.geometry.points import PointIndex
    from eqvit.groups.base import describe_element

    points = np.asarray(points, dtype=np.float64)
    if group.dim != points.shape[1]:
        raise ValueError(f"{group.name} acts in {group.dim}-D; {what}: {points.shape[1]}-D points")
    index = PointIndex(points)
    for g, matrix in enumerate(group.elements):
        try:
            index.permutation(matrix)
        except ValueError:
            raise ValueError(
                f"{group.name} does not map {what} onto itself: element {g}, {describe_element(matrix)}"
            ) from None
