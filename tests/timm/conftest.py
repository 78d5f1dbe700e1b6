"""timm's own model tests, run on eqvit's image models.

``test_models.py`` is ``tests/test_models.py`` of timm 1.0.31 (the source distribution:
``pip download --no-binary :all: --no-deps timm==1.0.31``) with its ``list_models(...)`` calls replaced by
eqvit's image models (``eqvit.list_models(exclude_filters=..., inputs="images")``, the same exclude filters).
``test_model_default_cfgs`` gets no eqvit model: timm sends its ViTs (``NON_STD_FILTERS``: ``vit_*``,
``deit*``, ``eva_*``, ...) to ``test_model_default_cfgs_non_std``, because their ``forward_features``
returns tokens ``[B, N, C]``, not a ``[B, C, H, W]`` map; eqvit's models are ViTs.

This file keeps the tests that are parametrised over the model list; the rest of timm's file tests named
timm architectures (``convnext_atto``, ``swin_*``, ...) and is deselected here.
"""

from pathlib import Path

MODEL_LIST_TESTS = {
    "test_model_forward",
    "test_model_backward",
    "test_model_default_cfgs",
    "test_model_default_cfgs_non_std",
    "test_model_forward_torchscript",
    "test_model_forward_features",
    "test_model_forward_intermediates",
    "test_model_forward_intermediates_features",
    "test_model_forward_fx",
    "test_model_backward_fx",
}


def _dropped(item) -> bool:
    """A test of timm's file that is not parametrised over the model list (only items of this folder)."""
    here = Path(__file__).parent
    return item.path.is_relative_to(here) and getattr(item, "originalname", item.name) not in MODEL_LIST_TESTS


def pytest_collection_modifyitems(config, items):
    # The hook sees the whole session's items: deselect only timm's own, never the project's.
    dropped = [item for item in items if _dropped(item)]
    keep = [item for item in items if not _dropped(item)]
    items[:] = keep
    if dropped:
        config.hook.pytest_deselected(items=dropped)


def pytest_configure(config):
    # The marks timm's file uses (timm's CI selects by them); `timeout` is pytest-timeout's.
    for mark in (
        "base",
        "cfg",
        "cfg_nonstd",
        "features",
        "forward",
        "backward",
        "fxforward",
        "fxbackward",
        "torchscript",
        "timeout",
    ):
        config.addinivalue_line("markers", f"{mark}: a mark of timm's own test file")
