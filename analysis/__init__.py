"""RouteScope analyses: pure functions from traces to tidy DataFrames, exports and the CLI."""
