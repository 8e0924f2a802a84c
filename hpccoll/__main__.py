"""``python -m hpccoll <command>``: demo (the main job) or config (effective settings)."""
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"demo": "hpccoll.demo", "config": "hpccoll.config"}
    if not argv or argv[0] not in commands:
        print("usage: python -m hpccoll {demo|config} [args...]\n"
              "  demo    every collective checked and timed against MPI (run under mpiexec)\n"
              "  config  the effective settings and where each came from (--markdown: docs)",
              file=sys.stderr)
        return 2
    import importlib
    return importlib.import_module(commands[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
