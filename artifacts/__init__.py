"""The artifact format and everything that moves artifacts around."""

from artifacts.loader import LoadedArtifact, load
from artifacts.manifest import Manifest, read_manifest

__all__ = ["LoadedArtifact", "Manifest", "load", "read_manifest"]
