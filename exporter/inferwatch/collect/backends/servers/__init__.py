"""One module per inference server, each declaring its table as ``BACKEND``; the registry
(:data:`inferwatch.collect.backends.BACKENDS`) finds them here."""
