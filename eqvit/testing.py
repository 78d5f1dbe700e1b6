"""Equivariance checks for users and for the test suite.

``assert_equivariant(model)`` evaluates ``model`` in float64 on a random input, acts on the input
with every element of the model's group (or random rotations for SO(3)), and compares the output
with the correspondingly transformed original output. It raises :class:`EquivarianceError` with a
per-element table when the relative error of any element exceeds the tolerance.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from eqvit.groups import FiniteGroup, get_group
from eqvit.groups.base import describe_element

Action = Callable[[np.ndarray, torch.Tensor], torch.Tensor]
"""``action(matrix, x)``: the group element (as a ``[d, d]`` orthogonal matrix) applied to ``x``."""

DEFAULT_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


class EquivarianceError(AssertionError):
    """Raised by :func:`assert_equivariant`; ``.report`` holds the measured errors."""

    def __init__(self, message: str, report: EquivarianceReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class EquivarianceReport:
    """Errors of one check. ``rows``: (label, max abs error, relative error) per element."""

    group: str
    dtype: torch.dtype
    tolerance: float
    rows: list[tuple[str, float, float]]

    @property
    def max_relative_error(self) -> float:
        return max((r[2] for r in self.rows), default=0.0)

    @property
    def passed(self) -> bool:
        return self.max_relative_error <= self.tolerance

    def table(self) -> str:
        header = f"{'element':<34} {'max abs err':>12} {'rel err':>12}  "
        lines = [header, "-" * len(header)]
        for label, abs_err, rel_err in self.rows:
            flag = "FAIL" if rel_err > self.tolerance else "ok"
            lines.append(f"{label:<34} {abs_err:12.3e} {rel_err:12.3e}  {flag}")
        return "\n".join(lines)

    def __str__(self) -> str:
        verdict = "equivariant" if self.passed else "NOT equivariant"
        return (
            f"{verdict} under {self.group} ({str(self.dtype).replace('torch.', '')}, "
            f"tolerance {self.tolerance:.0e}, max rel err {self.max_relative_error:.3e})\n{self.table()}"
        )


def invariant_action(matrix: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """The trivial action, for invariant outputs (class logits)."""
    return x


def _cast(inputs: torch.Tensor | tuple[torch.Tensor, ...], dtype: torch.dtype) -> torch.Tensor | tuple:
    return tuple(t.to(dtype) for t in inputs) if isinstance(inputs, tuple) else inputs.to(dtype)


def _call(model: Callable, inputs: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Models with several inputs (point clouds: ``model(pos, feat)``) get a tuple."""
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


def type_action(ftype) -> Action:
    """The action of a :class:`~eqvit.nn.irrep_features.FeatureType` on tensors ``[..., ftype.dim]``,
    as an :data:`Action` (the element given by its matrix)."""
    group = ftype.group

    def action(matrix: np.ndarray, x: torch.Tensor) -> torch.Tensor:
        return ftype.act(int(group.index_of(matrix)), x)

    return action


def _declared_types(model: object) -> tuple | None:
    """``(in_type, out_type)`` of a module that declares them (a layer, not a model with a domain)."""
    in_type, out_type = getattr(model, "in_type", None), getattr(model, "out_type", None)
    if in_type is None or out_type is None or getattr(model, "domain", None) is not None:
        return None
    return in_type, out_type


def _resolve_group(model: nn.Module, group: FiniteGroup | str | None) -> FiniteGroup | str:
    if group is None and _declared_types(model) is not None:
        group = _declared_types(model)[0].group
    if group is None:
        group = getattr(model, "group", None)
        if group is None:
            raise ValueError("model has no .group attribute: pass group=... explicitly")
    if isinstance(group, str) and group.upper() != "SO3":
        group = get_group(group)
    return group


_GROUPS_BY_DIM = {2: "'C4', 'D4' (square grids) or 'D6' (hexagonal grids)", 3: "'T', 'O', 'I' or 'SO3'"}


def _check_arguments(tolerance: object, dtype: object, num_rotations: object, batch_size: object) -> None:
    if tolerance is not None and (
        isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or math.isnan(tolerance) or tolerance < 0
    ):
        raise ValueError(
            f"expected tolerance to be a number >= 0 (the bound on the relative error; inf only reports), "
            f"got {tolerance!r}"
        )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"expected dtype to be a floating-point torch dtype (e.g. torch.float64), got {dtype!r}")
    for name, value in (("num_rotations", num_rotations), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"expected {name} to be a positive integer, got {value!r}")


def _domain_name(domain: object) -> str:
    return getattr(domain, "name", type(domain).__name__)


def _check_dimension(group: FiniteGroup | str, domain: object) -> None:
    """ValueError unless the group's matrices have the dimension of the domain's points."""
    domain_dim = getattr(domain, "dim", None)
    group_dim = 3 if isinstance(group, str) else group.elements.shape[-1]  # a str is "SO3" here
    if domain_dim is None or group_dim == domain_dim:
        return
    name = group if isinstance(group, str) else group.name
    suggestion = _GROUPS_BY_DIM.get(domain_dim)
    raise ValueError(
        f"group {name} acts in {group_dim}-D ({group_dim}x{group_dim} matrices), but the model's domain "
        f"({_domain_name(domain)}) is {domain_dim}-D"
        + (f": pass a {domain_dim}-D group such as {suggestion}" if suggestion else "")
    )


def _check_closed(domain: object, matrices: np.ndarray, name: str) -> None:
    """ValueError unless every element maps the domain's points onto its points (for point sets)."""
    if not hasattr(domain, "permutation"):
        return
    for k, g in enumerate(matrices):
        try:
            domain.permutation(g)
        except ValueError as err:
            raise ValueError(
                f"group {name} does not act on the model's domain ({_domain_name(domain)}): element {k} "
                f"({describe_element(g)}) does not map its points onto its points ({err})"
            ) from None


def assert_equivariant(
    model: nn.Module | Callable[[torch.Tensor], torch.Tensor],
    group: FiniteGroup | str | None = None,
    *,
    inputs: torch.Tensor | None = None,
    input_action: Action | None = None,
    output_action: Action | str | None = None,
    dtype: torch.dtype = torch.float64,
    tolerance: float | None = None,
    num_rotations: int = 8,
    batch_size: int = 2,
    seed: int = 0,
    num_tokens: int = 5,
) -> EquivarianceReport:
    """Check ``model(g . x) == g . model(x)`` for every element g of ``group``.

    A layer that declares ``in_type`` and ``out_type`` (:class:`~eqvit.nn.irrep_features.FeatureType`)
    is checked like a model: the actions are read from its types and the default input is
    ``[batch_size, num_tokens, in_type.dim]`` standard normal tokens.

    Args:
        model: an ``nn.Module`` (copied and cast to ``dtype``) or a plain function.
        group: a FiniteGroup, a name for :func:`get_group`, or ``"SO3"`` for ``num_rotations``
            random rotations; defaults to ``model.group``.
        inputs: the input ``x`` (a tuple for models called with several inputs); by default
            ``model.domain.random_input(batch_size, model.in_chans)``, e.g. standard normal
            ``[batch_size, model.in_chans, *model.domain.shape]``.
        input_action: ``action(matrix, x)``; defaults to ``model.domain.act``.
        output_action: ``action(matrix, y)``, or ``"invariant"``, or ``"same"`` (the input
            action); defaults to ``model.output_action`` when the model defines it, else ``"same"``.
        dtype: evaluation dtype; float64 by default (exact up to round-off).
        tolerance: bound on the relative error ``max|f(gx) - g f(x)| / max|g f(x)|``; defaults to
            1e-10 in float64 and 1e-5 in float32.

    Returns:
        The :class:`EquivarianceReport` (also when it passes).

    Raises:
        EquivarianceError: with the per-element table if any element exceeds the tolerance.
    """
    _check_arguments(tolerance, dtype, num_rotations, batch_size)
    group = _resolve_group(model, group)
    domain = getattr(model, "domain", None)
    types = _declared_types(model)
    if types is not None:
        input_action = input_action or type_action(types[0])
        output_action = output_action or type_action(types[1])
    on_domain = input_action is None
    if on_domain:
        if domain is None:
            raise ValueError("model has no .domain attribute: pass input_action=... explicitly")
        _check_dimension(group, domain)
        input_action = domain.act
    if output_action is None:
        output_action = getattr(model, "output_action", "same")
    if output_action == "same":
        output_action = input_action
    elif output_action == "invariant":
        output_action = invariant_action
    if tolerance is None:
        tolerance = DEFAULT_TOLERANCE.get(dtype, 1e-5)

    gen = torch.Generator().manual_seed(seed)
    if inputs is None and types is not None:
        inputs = torch.randn(batch_size, num_tokens, types[0].dim, generator=gen)
    if inputs is None:
        if domain is None or not hasattr(model, "in_chans"):
            raise ValueError("pass inputs=... (model lacks .domain or .in_chans to build a random input)")
        inputs = domain.random_input(batch_size, model.in_chans, generator=gen)
    x = _cast(inputs, dtype)

    if isinstance(group, FiniteGroup):
        matrices, name = group.elements, group.name
    else:
        from eqvit.groups.so3 import random_rotations

        matrices = random_rotations(num_rotations, generator=gen, dtype=torch.float64).numpy()
        name = f"SO(3) ({num_rotations} random rotations)"
    if on_domain:
        _check_closed(domain, matrices, name)

    if isinstance(model, nn.Module):
        model = copy.deepcopy(model).to(dtype).eval()

    rows = []
    with torch.no_grad():
        y = _call(model, x)
        if not torch.isfinite(y).all() or y.abs().max().item() == 0.0:
            # A zero (or non-finite) output passes any comparison: refuse the vacuous check.
            raise ValueError(
                "model output is identically zero or not finite on the test input; the equivariance "
                "check would be vacuous (re-initialise the weights, e.g. a zero-initialised head)"
            )
        for k, g in enumerate(matrices):
            expected = output_action(g, y)
            got = _call(model, input_action(g, x))
            abs_err = (got - expected).abs().max().item()
            scale = expected.abs().max().item()
            rows.append((f"{k:>3} {describe_element(g)}", abs_err, abs_err / max(scale, 1e-300)))
    report = EquivarianceReport(name, dtype, tolerance, rows)
    if not report.passed:
        raise EquivarianceError(str(report), report)
    return report


def randomise_parameters_(
    module: nn.Module, seed: int = 0, scale: float | None = None, skip: tuple[str, ...] = ()
) -> nn.Module:
    """Add Gaussian noise to every parameter (except names starting with ``skip``), in place; returns ``module``.

    timm's small init leaves paths nearly silent (a zero-initialised head makes a fresh model output
    exactly zero), and an equivariance or agreement check on a silent model could not fail. The std is
    ``scale`` or, when None, ``1/sqrt(fan_in)`` for matrices and 0.1 otherwise.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.startswith(skip):
                continue
            std = scale if scale is not None else (p[0].numel() ** -0.5 if p.ndim >= 2 else 0.1)
            p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * std)
    return module
