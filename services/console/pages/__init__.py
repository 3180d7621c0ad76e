"""The console's pages, one module per section; routes stay thin, the views they render live beside them."""
