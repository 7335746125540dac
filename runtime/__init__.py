"""thrifty.runtime: the command line, executors, schedulers and providers."""

__all__: list[str] = []
