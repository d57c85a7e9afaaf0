"""Functions returning plotly figures or HTML, testable without Streamlit."""
