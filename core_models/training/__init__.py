"""Synthetic training corpus and tokenizer for the shipped RouteScope models."""
