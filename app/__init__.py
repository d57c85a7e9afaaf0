"""RouteScope's Streamlit explorer: layout only; everything it shows comes from core_models and analysis."""
