"""A dataset routed through a model: the shipped datasets (shipped; a user's file is read by
`analysis.inputs.datasets`), the streaming run (run), the per-option statistics (stats: the counts;
reductions: their tables; compare: two models side by side; values: per-call values), column names
and help (columns), and the offline page (page)."""
