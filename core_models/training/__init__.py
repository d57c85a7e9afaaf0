"""Synthetic training corpus and tokenizer for the shipped RouteScope models."""

from routescope.layout import only_as  # noqa: E402

only_as("routescope.core_models.training", __name__)
