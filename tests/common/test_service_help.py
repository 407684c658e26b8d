"""Every service's ``--help`` lists every setting it reads (variable, type, default, meaning), made
from its settings struct; a bad value is one line naming the variable, and exit status 2."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from gpushare_common.settings import Variable, variables

SERVICES = ("console", "detector", "deviceplugin", "dra-driver", "kmod-bridge", "nats-auth", "shadow-controller",
            "solver")


def package(service: str) -> str:
    return f"gpushare_{service.replace('-', '_')}"


def settings_of(service: str) -> Any:
    return importlib.import_module(f"{package(service)}.settings").Settings


def own_number(service: str) -> Variable:
    """The first number the service itself reads (not a common topic's)."""
    common = ("GPUSHARE_NATS_", "GPUSHARE_HTTP_", "GPUSHARE_LOG_", "GPUSHARE_NODE_", "GPUSHARE_KUBE_")
    return next(v for v in variables(settings_of(service))
                if v.kind in ("number", "integer") and not v.name.startswith(common))


@pytest.mark.parametrize("service", SERVICES)
def test_help_lists_every_setting_with_its_type_default_and_meaning(
        service: str, capsys: pytest.CaptureFixture[str]) -> None:
    main = importlib.import_module(f"{package(service)}.main").main
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    listed = variables(settings_of(service))
    assert len(listed) >= 10
    for variable in listed:
        assert variable.meaning, f"{variable.name} has no meaning (a docstring under its field)"
        default = variable.default or '""'
        assert f"  {variable.name}  ({variable.kind}, default {default})\n" in text, variable.name
        assert " ".join(variable.meaning.split()[:6]) in " ".join(text.split()), variable.name
    port = next(v for v in listed if v.name == "GPUSHARE_HTTP_PORT")
    assert port.default == str(settings_of(service).DEFAULT_PORT)


@pytest.mark.parametrize("service", SERVICES)
def test_a_bad_value_is_one_line_naming_the_variable_and_exit_2(
        service: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    variable = own_number(service)
    monkeypatch.setenv(variable.name, "soon")
    main = importlib.import_module(f"{package(service)}.main").main
    assert main([]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"gpushare-{service}: {variable.name}='soon': expected a number")


@pytest.mark.parametrize("service", SERVICES)
def test_the_command_line_names_the_service_as_it_names_itself(service: str) -> None:
    """``--help`` is answered before the service is imported: its name and description come from
    the entry point and the app module's source; they are the service's own."""
    from gpushare_common.entry import docstring_of

    app = importlib.import_module(f"{package(service)}.app")
    assert service == app.SERVICE
    assert docstring_of(f"{package(service)}.app") == inspect.cleandoc(app.__doc__ or "") != ""
    main_source = importlib.import_module(f"{package(service)}.main").__file__
    assert main_source and f'service_main("{service}", ' in Path(main_source).read_text(encoding="utf-8")


def test_python_dash_m_help_of_every_service() -> None:
    """``python -m gpushare_<name> --help``, every service at once (each waited for as long as a
    loaded machine takes to import it; none left running whatever happens)."""
    running = {s: subprocess.Popen([sys.executable, "-m", package(s), "--help"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for s in SERVICES}
    deadline = time.monotonic() + 240
    try:
        for service, proc in running.items():
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert proc.returncode == 0, err
            assert out.startswith(f"usage: gpushare-{service} [-h]")
            assert f"  {own_number(service).name}  (" in out and "  GPUSHARE_HTTP_PORT  (integer, default " in out
    finally:
        for proc in running.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
