"""Patch embeddings and their inverses."""

from eqvit.nn.tokenizers.icosphere import (
    IcosphereLifting,
    IcospherePatchEmbed,
    IcosphereUnpatchify,
    icosphere_lifting,
)

__all__ = ["IcosphereLifting", "IcospherePatchEmbed", "IcosphereUnpatchify", "icosphere_lifting"]
