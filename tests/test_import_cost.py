"""Start-up cost: ``import eqvit`` and ``eqvit list`` leave the heavy optional modules unloaded.

torch-harmonics alone took 4.6 s of a 9.4 s ``import eqvit`` when ``eqvit.models.baselines``
imported it at the top. Each check runs in a fresh interpreter, since this test process has
long since imported everything; the timing itself is measured by ``benchmarks/import_time.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import ROOT

# Loaded only when first used: torch-harmonics (S2Transformer, shallow-water data and metrics)
# and what it pulls in, plotting, and the other optional extras.
LAZY = ("torch_harmonics", "scipy", "networkx", "matplotlib", "sklearn", "pandas", "mlxtend", "tensorboard")


def _run(code: str) -> dict:
    """Run ``code`` in a fresh interpreter that imports this checkout's eqvit; return its JSON line."""
    prelude = f"import json, sys\nLAZY = {LAZY!r}\ndef loaded():\n    return [m for m in LAZY if m in sys.modules]\n"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_eqvit_leaves_heavy_modules_unloaded_until_a_model_needs_them():
    out = _run(
        """
        import eqvit
        after_import = loaded()
        import timm
        registered = (eqvit.list_models("s2transformer_*"), timm.list_models("s2transformer_*"))
        after_registry = loaded()
        import torch
        model = eqvit.create_model("s2transformer_tiny")
        y = model(torch.randn(1, 3, 16, 32))
        print(json.dumps(dict(
            file=eqvit.__file__, after_import=after_import, registered=registered, after_registry=after_registry,
            after_build=loaded(), shape=list(y.shape), finite=bool(torch.isfinite(y).all()),
        )))
        """
    )
    assert Path(out["file"]).resolve().is_relative_to(ROOT)
    assert out["after_import"] == [], f"import eqvit loaded {out['after_import']}"
    names = ["s2transformer_4x128", "s2transformer_4x256", "s2transformer_4x512", "s2transformer_8x256"]
    assert out["registered"][0] == out["registered"][1] == sorted([*names, "s2transformer_tiny"])
    assert out["after_registry"] == []
    assert "torch_harmonics" in out["after_build"]  # building the baseline imports it
    assert out["shape"] == [1, 3, 16, 32] and out["finite"]


def test_eqvit_list_leaves_heavy_modules_unloaded():
    out = _run(
        """
        import contextlib, io
        from eqvit.cli import main
        with contextlib.redirect_stdout(io.StringIO()) as stdout:
            rc = main(["list"])
        print(json.dumps(dict(rc=rc, names=stdout.getvalue().split(), loaded=loaded())))
        """
    )
    assert out["rc"] == 0
    assert "s2transformer_tiny" in out["names"] and "so3vit_tiny" in out["names"]
    assert out["loaded"] == [], f"eqvit list loaded {out['loaded']}"
