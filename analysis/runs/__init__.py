"""Runs and their views: one prompt traced and analysed (session), the routing views and family
views read from its traces, ablation effects, attribution, prompts, the probe sets, the checkpoint
catalog."""
