"""One module per tab of the explorer."""
