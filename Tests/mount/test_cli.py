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
    (["mount", "{tmp}", "--endpoint", "http://127.0.0.1:1"], "--endpoint is for s3:// stores"),
    (["mount", "{tmp}", "--store", "s3://Bad_Bucket/x"], "is not a bucket name"),
    (["mount", "{tmp}", "--store", "s3://bucket/x", "--endpoint", "ftp://host"], "must be http(s)://HOST[:PORT]"),
    (["mount", "{tmp}", "--store", "s3://bucket/x", "--addressing", "sideways"], "--addressing must be path or virtual"),
], ids=["empty-mountpoint", "poll-0", "poll-4000", "cache-negative", "cache-word", "scope-without-container",
        "endpoint-without-s3", "bad-bucket", "bad-endpoint", "bad-addressing"])
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


def test_messages_name_paths_as_the_user_sees_them(make_device, store):
    """`download` of a drive folder and `evict` name the path on this machine,
    never the container's internal /Documents path; a mount that creates a
    container says so (a mistyped ID would otherwise go unnoticed)."""
    from conftest import store_args
    made = run("container", "create", "com.example.notes", "--name", "Notes", "--public", *store_args(store))
    assert made.returncode == 0, made.stderr
    drive = make_device("drive")
    (drive.mountpoint / "Notes" / "a.txt").write_text("a")
    res = drive.cli("download", str(drive.mountpoint / "Notes"), timeout=30)
    assert res.returncode != 0 and f"{drive.mountpoint}/Notes is a folder: use --recursive" in res.stderr, res
    assert "/Documents" not in res.stderr, res

    typo = make_device("typo", mount=False, data_home=drive.data_home, container="com.exmaple.notes")
    res = typo.mount()
    assert "Created container com.exmaple.notes in the store" in res.stdout, res
    again = make_device("again", mount=False, data_home=drive.data_home, container="com.exmaple.notes")
    res = again.mount()
    assert "Created container" not in res.stdout, res
