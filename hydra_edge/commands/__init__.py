"""One module per command, named as the user types it; each parses its options and calls its stage."""
