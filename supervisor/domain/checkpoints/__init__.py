"""Checkpoints: manifests, verification checks and layouts, demotion, and the resume plan."""
