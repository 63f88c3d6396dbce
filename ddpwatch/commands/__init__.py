"""One module per CLI command: each gathers its inputs, calls the pure code and prints."""
