"""The gsdistill command dispatches each stage and rejects unknown ones with a hint."""
import importlib
import subprocess
import sys

from gsdistill import cli


def test_help_lists_every_stage(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for stage in cli.STAGES:
        assert stage in out


def test_unknown_stage_gets_a_hint(capsys):
    assert cli.main(["pretrian"]) == 2
    assert "did you mean 'pretrain'" in capsys.readouterr().err


def test_every_stage_module_exists_with_main():
    for name, (module, _) in cli.STAGES.items():
        mod = importlib.import_module(module)
        assert callable(getattr(mod, "main", None)), f"{module} has no main() for 'gsdistill {name}'"


def test_console_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "gsdistill.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("gsdistill ")
