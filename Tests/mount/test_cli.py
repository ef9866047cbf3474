"""The command line's own messages: --version, help, and the errors for bad
arguments. Each error must name what is wrong (not ArgumentParser's generic
"missing value"), exit with status 64 (usage) and mount nothing."""

from __future__ import annotations

import subprocess

import pytest

from conftest import BIN


def run(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=30, env=env)


def test_version_names_the_program_and_a_version():
    res = run("--version")
    assert res.returncode == 0, res.stderr
    words = res.stdout.split()
    assert words[0] == "ubiquityfs" and len(words) == 2 and words[1][0].isdigit(), res.stdout


def test_help_lists_every_command():
    res = run("--help")
    assert res.returncode == 0, res.stderr
    for command in ("mount", "unmount", "status", "download", "evict", "pin", "unpin", "versions", "resolve",
                    "container", "query"):
        assert f"\n  {command}" in res.stdout, f"{command} missing from --help:\n{res.stdout}"


@pytest.mark.parametrize("args, message", [
    (["mount", ""], "the mountpoint is empty"),
    (["mount", "{tmp}", "--poll-interval", "0"], "--poll-interval must be more than 0 and at most 3600 seconds (got 0)"),
    (["mount", "{tmp}", "--poll-interval", "4000"], "--poll-interval must be more than 0 and at most 3600 seconds"),
    (["mount", "{tmp}", "--cache-size", "-5"], "--cache-size: '-5' is not a size"),
    (["mount", "{tmp}", "--cache-size", "lots"], "--cache-size: 'lots' is not a size"),
    (["mount", "{tmp}", "--scope", "documents"], "--scope needs --container"),
], ids=["empty-mountpoint", "poll-0", "poll-4000", "cache-negative", "cache-word", "scope-without-container"])
def test_bad_arguments_are_named(tmp_path, args, message):
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    res = run(*[a.replace("{tmp}", str(mountpoint)) for a in args],
              env={"PATH": "/usr/bin:/bin", "XDG_DATA_HOME": str(tmp_path / "data")})
    assert res.returncode == 64, f"{args}: exit {res.returncode}\n{res.stdout}{res.stderr}"
    assert message in res.stderr, f"{args}: {res.stderr!r}"
    assert not (tmp_path / "data" / "ubiquityfs").exists(), f"{args} created a data home"
    with open("/proc/self/mountinfo") as f:
        assert str(mountpoint) not in f.read(), f"{args} mounted something"
