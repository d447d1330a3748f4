"""The command lines: --help everywhere, every option explained, and the client CLI printing JSON against
the real server (quietly cut short by a reader that leaves)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from pooltriton.cli import build_parser
from pooltriton.client.cli import build_parser as build_client_parser


@pytest.mark.parametrize("module", ["pooltriton.cli", "pooltriton.client"])
def test_help(module: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--help"], check=True, capture_output=True, text=True)
    assert "usage" in out.stdout


@pytest.mark.parametrize("build", [build_parser, build_client_parser])
def test_every_option_of_every_command_says_what_it_does(build) -> None:
    """Every option has help (`pooltriton serve --help` once listed --repository, --backends and the ports bare)."""
    parser = build()
    commands = {"": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands.update(action.choices)
    bare = [(name, action.dest) for name, command in commands.items() for action in command._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) and not action.help]
    assert len(commands) > 3 and not bare, bare


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_client_cli_prints_json(server, protocol: str) -> None:
    url = server.http_url if protocol == "http" else server.grpc_url
    out = subprocess.run(
        [sys.executable, "-m", "pooltriton.client", "--url", url, "--protocol", protocol,
         "embed", "A man is eating food.", "hello"],
        check=True, capture_output=True, text=True,
    ).stdout
    data = json.loads(out)["data"]
    assert len(data) == 2 and len(data[0]["embedding"]) == 384
    assert abs(data[0]["embedding"][0] - 0.0332) < 1e-4


def test_client_cli_ends_quietly_when_its_reader_leaves(server) -> None:
    """`pooltriton-client embed ... | head`: no BrokenPipeError traceback. The answer (~300 KB of
    JSON) is larger than the pipe holds, so the client is still writing when the reader closes it."""
    texts = [f"text number {i}" for i in range(40)]
    client = subprocess.Popen([sys.executable, "-m", "pooltriton.client", "--url", server.http_url, "embed", *texts],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert client.stdout.read(100).startswith(b'{"model"')
    client.stdout.close()
    _, errors = client.communicate(timeout=60)
    assert client.returncode == 1 and errors == b"", errors.decode()
