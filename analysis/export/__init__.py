"""Exports and writers: a run's long route table (run_table, columns), the one CSV format
(csv_format), the export's CSV and Parquet files with provenance (table_files) and where they are
written (output_files), batch export of many prompts (batch), the Ray export (ray_export,
ray_prompts, ray_output), and what offline pages embed (html_safe, plotly_bundle)."""
