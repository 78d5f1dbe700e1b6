"""The README's Python examples run as written (in a scratch folder: one writes model.onnx)."""

from __future__ import annotations

import re

from helpers import ROOT

README = ROOT / "README.md"


def test_the_readme_examples_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {i}", "exec"), namespace)
    assert (tmp_path / "model.onnx").is_file()
