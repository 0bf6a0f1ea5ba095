"""The ``jf-jax`` command (``python -m jf_jax``): every pipeline command reachable, with its help, and bad
commands refused with usage."""

import subprocess
import sys

import pytest

from jf_jax.cli.main import COMMANDS, main


def test_no_command_prints_usage_and_fails(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: jf-jax COMMAND") and all(f"  {name} " in out for name in COMMANDS)


def test_unknown_command_is_an_error(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help(command, capsys, monkeypatch):
    monkeypatch.setenv("JF_JAX_MALLOC", "default")  # `train` would re-execute this process (jf_jax.host_memory)
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert f"usage: jf-jax {command}" in capsys.readouterr().out


def test_python_dash_m_runs_the_dispatcher():
    proc = subprocess.run([sys.executable, "-m", "jf_jax", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "commands:" in proc.stdout


def test_every_command_is_also_a_module():
    """The README says each command runs as ``python -m jf_jax.COMMAND``: every one has that module, and it
    answers --help."""
    import importlib.util
    import subprocess
    import sys

    for command in COMMANDS:
        assert importlib.util.find_spec(f"jf_jax.{command}") is not None, f"python -m jf_jax.{command} is missing"
    proc = subprocess.run([sys.executable, "-m", "jf_jax.export", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "jf-jax export" in proc.stdout, proc.stderr[-2000:]
