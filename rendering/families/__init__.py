"""One drawing module per family: the drawers of its own views (`DRAWERS`: view name -> drawer)."""
