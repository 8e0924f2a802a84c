"""``hpccoll-bench`` / ``python -m hpccoll.bench``: nccl-tests compatible benchmarks of
hpccoll's collectives, optionally against MPI's own on the same buffers, with HDF5
result logs.  See ``hpccoll-bench --help`` and docs/results.md."""


def main(argv=None) -> int:
    from .cli import main as _main   # MPI is initialised there, not on import
    return _main(argv)


__all__ = ["main"]
