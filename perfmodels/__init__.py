"""thrifty.perfmodels: compute-latency and allreduce models, the iteration simulator, profilers."""
