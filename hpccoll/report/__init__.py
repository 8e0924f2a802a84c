"""``hpccoll-report``: read hpccoll result files (HDF5), print comparison tables, draw
plots, export engine traces as Chrome trace JSON.  See ``hpccoll-report --help``."""


def main(argv=None) -> int:
    from .cli import main as _main
    return _main(argv)


__all__ = ["main"]
