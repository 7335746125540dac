"""``python -m thrifty.runtime.worlds.zygote_main [MODULE ...]``: the
fork server process (`thrifty.runtime.worlds.zygote.serve`), as a
module of its own so that running it does not re-run the module the package
has already imported."""

from thrifty.runtime.worlds.zygote import serve

if __name__ == "__main__":
    serve()
