"""``python -m hpccoll <command>`` reaches every tool, the same main as the module form."""
import subprocess
import sys

import pytest

from hpccoll.__main__ import COMMANDS


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_answers_help(command):
    out = subprocess.run([sys.executable, "-m", "hpccoll", command, "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower()
    # the same parser as the module form: the same help text
    module = COMMANDS[command][0]
    direct = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                            text=True, timeout=120)
    assert direct.returncode == 0, direct.stderr
    assert out.stdout.splitlines()[1:] == direct.stdout.splitlines()[1:]


def test_no_or_unknown_command_lists_them_all():
    for argv, rc in (([], 2), (["nope"], 2), (["--help"], 0)):
        out = subprocess.run([sys.executable, "-m", "hpccoll", *argv], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == rc
        text = out.stdout + out.stderr
        assert all(name in text for name in COMMANDS)
        assert ("unknown command 'nope'" in text) == (argv == ["nope"])
