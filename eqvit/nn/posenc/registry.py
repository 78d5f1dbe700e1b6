"""One registry of positional schemes, keyed by name: every family builder takes its scheme from here.

A scheme is registered with the token bases it acts on and a builder that makes it for one model's tokens,
described by a :class:`TokenLayout` (what a family builder knows about its tokens: their feature type, the
attention's head split, fixed positions or poses)::

    @register_posenc("radial_ape", bases=("irreps", "frames", "plain"))
    def radial_ape(layout: TokenLayout, **options) -> PositionalScheme:
        ...

    eqvit.create_model("o2vit_square_tiny", posenc="radial_ape")  # or posenc=<a PositionalScheme>

Bases: ``"irreps"`` (irrep-wise tokens, the O(2) models), ``"frames"`` (regular features on frames, the
Platonic Transformers) and ``"plain"`` (features that do not transform: SO3ViT's tokens, whose poses carry
the symmetry). A rotary scheme says which basis it rotates queries and keys in (``qk_basis``); the O(2)
models rotate in the frame basis, so their attention takes frame RoPE's head split (``rotary_split``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from eqvit.groups import FiniteGroup
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.posenc.base import NoPositionalEncoding, PositionalScheme
from eqvit.nn.posenc.frame_rope import FrameRoPE
from eqvit.nn.posenc.invariant import FrameInvariantAPE, InvariantAPE
from eqvit.nn.posenc.learned import LearnedAPE, OrbitAPE
from eqvit.nn.posenc.so3rope import SO3RoPE
from eqvit.utils import unknown_name_error

BASES = ("irreps", "frames", "plain")


@dataclass(frozen=True, eq=False)
class TokenLayout:
    """The tokens a positional scheme is built for.

    Args:
        embed_dim: the token width.
        num_heads: attention heads (per frame for frame tokens).
        head_dim: channels per head.
        token_type: irrep-wise or frame features (:class:`~eqvit.nn.irrep_features.FeatureType`); None for
            plain features.
        positions: fixed token positions ``[N, d]`` (a grid), or None when they come with every input (point
            clouds: the scheme binds them per batch).
        poses: token poses ``[N, 3, 3]`` on SO(3) (SO3ViT's lifting), or None.
        pose_symmetry: the rotations that permute ``poses`` (the model's group), or None.
        spacing: the distance between neighbouring tokens, in position units.
        extent: the radius of the token positions (default: the largest ``|position|``, at least ``spacing``).
        coefficients: a :class:`~eqvit.nn.regular.RegularBasis` when frame tokens are kept as their Fourier
            coefficients (the Platonic Fourier stream).
    """

    embed_dim: int
    num_heads: int
    head_dim: int
    token_type: FeatureType | None = None
    positions: np.ndarray | None = None
    poses: np.ndarray | None = None
    pose_symmetry: FiniteGroup | None = None
    spacing: float = 1.0
    extent: float | None = None
    coefficients: Any = None

    @property
    def basis(self) -> str:
        """``"irreps"``, ``"frames"`` or ``"plain"`` (:data:`BASES`)."""
        if self.token_type is None:
            return "plain"
        return "frames" if self.token_type.basis == "frames" else "irreps"

    @property
    def group(self) -> FiniteGroup | None:
        return None if self.token_type is None else self.token_type.group

    @property
    def num_tokens(self) -> int | None:
        source = self.positions if self.positions is not None else self.poses
        return None if source is None else len(source)

    @property
    def radius(self) -> float:
        """:attr:`extent`, or the largest ``|position|`` (at least one :attr:`spacing`)."""
        if self.extent is not None:
            return self.extent
        largest = 0.0 if self.positions is None else float(np.linalg.norm(self.positions, axis=-1).max())
        return max(largest, self.spacing)


Builder = Callable[..., PositionalScheme]


NEEDS = ("positions", "poses", "pose_symmetry", "num_tokens")


@dataclass(frozen=True)
class _Entry:
    builder: Builder
    bases: tuple[str, ...]
    needs: tuple[str, ...]

    def fits(self, layout: TokenLayout) -> bool:
        return layout.basis in self.bases and all(getattr(layout, need) is not None for need in self.needs)


_SCHEMES: dict[str, _Entry] = {}


def register_posenc(name: str, bases: Sequence[str] = BASES, needs: Sequence[str] = ()) -> Callable[[Builder], Builder]:
    """Register ``builder(layout: TokenLayout, **options) -> PositionalScheme`` under ``name``: the token
    ``bases`` it acts on and what it ``needs`` from the tokens (:data:`NEEDS`: fixed ``positions``, ``poses``,
    the ``pose_symmetry``, a fixed ``num_tokens``)."""
    unknown = sorted(set(bases) - set(BASES)) + sorted(set(needs) - set(NEEDS))
    if unknown:
        raise ValueError(f"unknown token bases or needs {unknown}; valid: {', '.join(BASES + NEEDS)}")

    def wrap(builder: Builder) -> Builder:
        _SCHEMES[name] = _Entry(builder, tuple(bases), tuple(needs))
        return builder

    return wrap


def unregister_posenc(name: str) -> None:
    """Remove the scheme ``name`` (a KeyError naming it when it is not registered)."""
    if name not in _SCHEMES:
        raise KeyError(f"no positional scheme {name!r} is registered")
    del _SCHEMES[name]


def list_posencs(layout: TokenLayout | None = None) -> list[str]:
    """Registered scheme names (those that fit ``layout``'s tokens when given), sorted."""
    return sorted(name for name, entry in _SCHEMES.items() if layout is None or entry.fits(layout))


def build_posenc(spec: str | PositionalScheme | Builder, layout: TokenLayout, **options: Any) -> PositionalScheme:
    """The scheme ``spec`` for ``layout``: a registered name, a :class:`PositionalScheme` (used as it is) or a
    builder ``spec(layout, **options)``. ``options`` are the family's settings (e.g. wavelengths); each builder
    takes those it knows. An unknown name or a scheme that does not act on these tokens is a ValueError."""
    if isinstance(spec, PositionalScheme):
        return spec
    if callable(spec):
        return spec(layout, **options)
    names = list_posencs(layout)
    if spec not in _SCHEMES:
        raise unknown_name_error(f"posenc for {layout.basis} tokens", spec, names)
    entry = _SCHEMES[spec]
    if layout.basis not in entry.bases:
        raise ValueError(
            f"posenc {spec!r} acts on {' or '.join(entry.bases)} tokens; these are {layout.basis} tokens "
            f"(valid: {', '.join(names)})"
        )
    missing = [need.replace("_", " ") for need in entry.needs if getattr(layout, need) is None]
    if missing:
        raise ValueError(
            f"posenc {spec!r} needs fixed token {' and '.join(missing)}; these tokens have none, their positions "
            f"come with every input (valid: {', '.join(names)})"
        )
    return entry.builder(layout, **options)


def posenc_name(spec: str | PositionalScheme | Builder) -> str:
    """What a model config records for ``spec``: the name, or the class / function name of an object."""
    if isinstance(spec, str):
        return spec
    return type(spec).__name__ if isinstance(spec, PositionalScheme) else getattr(spec, "__name__", repr(spec))


# ------------------------------------------------------------------------------------------------ schemes


@register_posenc("none")
def _none(layout: TokenLayout, **options: Any) -> PositionalScheme:
    """No positional information: attention is permutation equivariant."""
    return NoPositionalEncoding()


@register_posenc("invariant_ape", bases=("irreps", "frames"), needs=("positions",))
def _invariant_ape(layout: TokenLayout, **options: Any) -> PositionalScheme:
    """The O(2) seed's G-invariant learned APE (Sec. 4.2.2), built in the irrep basis (mapped to frames): one
    encoding per token position, so the positions must be distinct."""
    distinct = len(np.unique(np.round(layout.positions, 9), axis=0))
    if distinct < len(layout.positions):
        raise ValueError(
            f"posenc 'invariant_ape' needs one token per position; these {len(layout.positions)} tokens sit at "
            f"{distinct} positions (several poses per patch): use 'frame_rope' or 'none'"
        )
    if layout.basis == "irreps":
        return InvariantAPE(layout.group, layout.positions, layout.token_type)
    return FrameInvariantAPE(layout.group, layout.positions, layout.token_type, coefficients=layout.coefficients)


@register_posenc("frame_rope", bases=("irreps", "frames"))
def _frame_rope(
    layout: TokenLayout,
    min_wavelength: float | None = None,
    max_wavelength: float | None = None,
    learnable_freqs: bool = False,
    **options: Any,
) -> PositionalScheme:
    """Frame RoPE (Platonic seed, Sec. 3.2) on the frames' heads; for irrep-wise tokens in the frame basis
    (``rotary_split``: the attention's channel groups when they have an even size, so coupled heads and
    frames-as-heads see relative positions only; otherwise one head over the channel pairs of each frame).
    Wavelengths default to ``2 x spacing`` and ``4 x radius``."""
    heads, dim = layout.num_heads, layout.head_dim
    if layout.basis == "irreps":
        try:
            channels = layout.token_type.in_frame_basis().channels
        except ValueError as err:
            raise ValueError(f"posenc='frame_rope' needs copies of the regular representation: {err}") from None
        if channels < 2:
            raise ValueError(f"frame RoPE rotates channel pairs: {layout.token_type} has {channels} channel per frame")
        per_head = channels // heads
        aligned = channels % heads == 0 and per_head % 2 == 0
        heads, dim = (heads, per_head) if aligned else (1, 2 * (channels // 2))
    positions = None if layout.positions is None else layout.positions.copy()
    return FrameRoPE(
        layout.group,
        heads,
        dim,
        positions=positions,
        learnable=learnable_freqs,
        min_wavelength=min_wavelength or 2.0 * layout.spacing,
        max_wavelength=max_wavelength or 4.0 * layout.radius,
    )


@register_posenc("so3rope", bases=("plain",), needs=("poses",))
def _so3rope(layout: TokenLayout, **options: Any) -> PositionalScheme:
    """SO(3)-RoPE (SO(3)-RoPE seed, Def. 1): Wigner-D blocks of the token poses on queries and keys."""
    return SO3RoPE(layout.head_dim, poses=torch.tensor(layout.poses, dtype=torch.float64))


@register_posenc("learned", bases=("plain",), needs=("poses", "pose_symmetry"))
def _orbit_ape(layout: TokenLayout, **options: Any) -> PositionalScheme:
    """A learned APE that is exactly invariant: one vector per orbit of the token poses under the model's
    rotations (:class:`~eqvit.nn.posenc.OrbitAPE`)."""
    return OrbitAPE(layout.poses, layout.pose_symmetry.elements, layout.embed_dim)


@register_posenc("ape", bases=("plain",), needs=("num_tokens",))
def _learned_ape(layout: TokenLayout, **options: Any) -> PositionalScheme:
    """A learned vector per token (timm's ``pos_embed``): it keeps no symmetry."""
    return LearnedAPE(layout.num_tokens, layout.embed_dim)
