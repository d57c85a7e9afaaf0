"""One analysis module per family: which of the role-driven views (`analysis.runs.routing`) the
family shows, the rows it adds to the export table and how its per-token routes are read, as a
`FamilyAnalysis` (`ANALYSIS`) that `analysis.runs.family_table` registers."""
