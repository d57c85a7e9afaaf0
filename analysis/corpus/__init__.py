"""A dataset routed through a model: the checked input (data), the streaming run (run), the
per-option statistics (stats, values), column names and help (columns), and the offline page (page)."""
