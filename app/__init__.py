"""RouteScope's Streamlit explorer: layout only; everything it shows comes from core_models and analysis."""

from routescope.layout import only_as  # noqa: E402

only_as("routescope.app", __name__)
