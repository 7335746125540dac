"""One module per `thrifty` command (see thrifty.runtime.cli)."""
