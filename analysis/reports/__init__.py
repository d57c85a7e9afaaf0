"""Reports over a checkpoint: the checkpoint report (report), causal expert importance (importance)
and the pruned checkpoint it leads to (prune)."""
