"""Exports and writers: the long route table (table, columns), CSV and Parquet with provenance
(tables), batch export of many prompts (batch), and what offline pages embed (html_safe,
plotly_bundle)."""
