"""``python -m hpccoll <command> [args...]``: one entry point to every tool.  Each command
is also its own module (``python -m hpccoll.chaos`` ...) and, where pyproject installs
one, a console script; all three forms run the same ``main``."""
import sys

# command -> (module with main(argv), one line of help); the order is the help's
COMMANDS = {
    "demo": ("hpccoll.demo", "every collective checked and timed against MPI (the main job; "
             "run under mpiexec)"),
    "bench": ("hpccoll.bench", "nccl-tests style sweeps of one collective (hpccoll-bench)"),
    "chaos": ("hpccoll.chaos", "the deadlock workloads under each policy (abba, latin, 3d, "
              "mixed)"),
    "report": ("hpccoll.report", "tables, plots and Chrome traces from result files "
               "(hpccoll-report)"),
    "tune": ("hpccoll.tuning.cli", "Libra's profile, plan and report of thread-block "
             "allocations (hpccoll-tune)"),
    "slurm": ("hpccoll.slurm", "the checks and stamps the slurm/ templates run"),
    "config": ("hpccoll.show_config", "the effective settings and where each came from "
               "(--all: internal ones too; --markdown: docs)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return ("usage: python -m hpccoll {" + "|".join(COMMANDS) + "} [args...]\n"
            + "\n".join(lines) + "\n`python -m hpccoll COMMAND --help` for each one's options")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        if argv:
            print(f"python -m hpccoll: unknown command {argv[0]!r}", file=sys.stderr)
        print(usage(), file=sys.stderr)
        return 2
    import importlib
    return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
