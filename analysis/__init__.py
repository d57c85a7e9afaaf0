"""RouteScope analyses: pure functions from traces to tidy DataFrames, exports and the CLI."""

from routescope.layout import only_as  # noqa: E402

only_as("routescope.analysis", __name__)
