"""``torch.compile(model, fullgraph=True)`` on every registered family: the training form (forward and
backward, through AOTAutograd) and the folded form trace as one graph each, with no graph break, and compute
what eager computes. The ``aot_eager`` backend checks the tracing (dynamo and AOTAutograd) without the time
Inductor's code generation takes; ``benchmarks/compile.py`` measures Inductor's compiled speed."""

from __future__ import annotations

import pytest
import torch
from helpers import TEST_MODELS, build, call, random_input

import eqvit


def _compiled(model: torch.nn.Module) -> torch.nn.Module:
    torch._dynamo.reset()
    return torch.compile(model, fullgraph=True, backend="aot_eager")


@pytest.mark.parametrize("name", TEST_MODELS)
def test_training_form_compiles_as_one_graph(name):
    model = build(name).eval()  # eval: dropout and drop-path off, so eager and compiled see the same function
    x = random_input(model)
    compiled = _compiled(model)
    out = call(compiled, x)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * weights).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    expected = call(model, x)
    (expected * weights).sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert grads and grads.keys() == {k for k, p in model.named_parameters() if p.grad is not None}
    for key, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[key], p.grad, rtol=1e-3, atol=1e-5, msg=f"{name}: {key}")


@pytest.mark.parametrize("name", TEST_MODELS)
def test_folded_form_compiles_as_one_graph(name):
    folded = eqvit.fold(build(name))
    x = random_input(folded)
    with torch.no_grad():
        torch.testing.assert_close(call(_compiled(folded), x), call(folded, x), rtol=1e-4, atol=1e-5)


def test_a_graph_break_fails_fullgraph():
    """The check can fail: a block that leaves the graph (what a Python-side branch on data does) is refused."""
    model = build("o2vit_square_tiny").eval()
    block = model.blocks[0]
    forward = block.forward

    def breaking(x, *args):
        torch._dynamo.graph_break()
        return forward(x, *args)

    block.forward = breaking
    with pytest.raises(Exception, match=r"(?i)graph break"):
        call(_compiled(model), random_input(model))
