"""The command line's own messages: --version, help, and the errors for bad
arguments. Each error must name what is wrong (not ArgumentParser's generic
"missing value"), exit with status 64 (usage) and mount nothing.

And the control protocol between the CLI and a real daemon: a request of
another protocol, or a hostile one, gets a typed error and the daemon keeps
serving; an answer of another protocol makes the CLI say so and exit 1."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import BIN, CONTROL_PROTOCOL, folder_store_only, is_mounted, pid_alive
from test_safety import control_socket, request


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


def test_a_max_read_mount_option_is_kept_and_the_mount_serves(make_device):
    """`-o max_read=N` reaches the kernel and the mount works: libfuse also
    needs the value from the daemon's `init`, and without it ended the
    session at the kernel's first request while `mount` had said it was
    mounted."""
    dev = make_device("a", mount=False)
    dev.mount_args = ("-o", "max_read=131072")
    res = dev.mount()
    assert res.returncode == 0, res
    with open("/proc/self/mountinfo") as f:
        line = next(l for l in f if f" {dev.mountpoint} " in l)
    assert "max_read=131072" in line, line
    data = os.urandom(3 << 20)
    (dev.mountpoint / "big.bin").write_bytes(data)
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    assert (dev.mountpoint / "big.bin").read_bytes() == data
    assert dev.cli("status", str(dev.mountpoint), timeout=30).returncode == 0


# --------------------------------------------------------------------------
# The control protocol, against a real daemon
# --------------------------------------------------------------------------


def answer(sock: str, payload) -> list[dict]:
    """The lines a daemon answers to one request (a dict is sent as JSON)."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode() + b"\n"
    return [json.loads(line) for line in request(sock, data).splitlines()]


def test_another_protocol_major_is_refused_and_the_daemon_keeps_serving(make_device):
    a = make_device("a")
    (a.mountpoint / "f.txt").write_text("x")
    sock = control_socket(a)
    for sent, speaks in ((f"{int(CONTROL_PROTOCOL.split('.')[0]) + 1}.0", None), (None, "an older protocol without versions")):
        req = {"command": "evict", "paths": [["f.txt"]]}
        if sent:
            req["protocol"] = sent
        lines = answer(sock, req)
        assert len(lines) == 1, lines
        reply = lines[0]
        assert reply["code"] == "protocolMismatch" and reply["protocol"] == CONTROL_PROTOCOL, reply
        assert f"this ubiquityfs ({speaks or 'protocol ' + sent}) cannot talk to the running daemon " \
               f"(pid {a.pid}, protocol {CONTROL_PROTOCOL})" in reply["error"], reply
        assert "unmount with the ubiquityfs that mounted it" in reply["error"], reply
    # Nothing of the refused requests was done: f.txt is still here, not evicted.
    assert os.stat(a.mountpoint / "f.txt").st_blocks > 0
    newer_minor = f"{CONTROL_PROTOCOL.split('.')[0]}.99"
    described = answer(sock, {"protocol": newer_minor, "command": "describe"})
    assert described[-1]["ok"] is True and described[-1]["containers"] == ["com.ubiquityfs.default"], described
    res = a.cli("status", str(a.mountpoint), timeout=60)
    assert res.returncode == 0 and "Mount:" in res.stdout, res


@folder_store_only("the store daemon's socket is named from the store's path")
def test_a_mount_of_another_protocol_is_refused_before_anything_is_mounted(make_device, store, tmp_path):
    """The store's daemon socket (`mount` joins a running daemon there)
    refuses another major before it looks at the mountpoint."""
    a = make_device("a")
    key = hashlib.sha256(f"{a.data_home}/ubiquityfs\n{store}".encode()).hexdigest()[:24]
    sock = str(Path(control_socket(a)).parent / f"daemon-{key}.sock")
    target = tmp_path / "second"
    target.mkdir()
    lines = answer(sock, {"protocol": "2.0", "command": "mount", "mountpoint": str(target)})
    assert len(lines) == 1 and lines[0]["code"] == "protocolMismatch", lines
    assert f"cannot talk to the running daemon (pid {a.pid}, protocol {CONTROL_PROTOCOL})" in lines[0]["error"], lines
    assert not is_mounted(target), "a mount request of another protocol was served"
    pong = answer(sock, {"protocol": CONTROL_PROTOCOL, "command": "ping"})
    assert pong == [{"ok": True, "pid": a.pid, "protocol": CONTROL_PROTOCOL}], pong


@pytest.mark.parametrize("payload, code, message", [
    (b"{\"protocol\": \"1.0\", \"command\": \n", "malformedRequest", "not a JSON object"),
    ({"protocol": CONTROL_PROTOCOL, "command": "evict", "paths": "f.txt"}, "malformedRequest", "field paths: expected"),
    ({"protocol": CONTROL_PROTOCOL, "command": "pin", "paths": [["f.txt", 7]]}, "malformedRequest", "field paths[0][1]: expected"),
    ({"protocol": CONTROL_PROTOCOL, "command": "query", "watch": "forever"}, "malformedRequest", "field watch: expected"),
    ({"protocol": CONTROL_PROTOCOL, "command": "versions"}, "malformedRequest", "field path is missing"),
    ({"protocol": 1, "command": "status"}, "malformedRequest", "field protocol: expected"),
    ({"protocol": CONTROL_PROTOCOL, "command": "rm -rf"}, "unknownCommand", "unknown command 'rm -rf'"),
    ({"protocol": CONTROL_PROTOCOL, "command": "mount", "mountpoint": "/"}, "unknownCommand", "does not serve mount"),
    (b'{"protocol":"1.0","command":"status","pad":"' + b"x" * (3 << 20) + b'"}\n', "requestTooLarge", "request too large"),
], ids=["cut-short", "paths-string", "path-number", "watch-string", "versions-no-path", "protocol-number",
        "unknown-command", "mount-on-mount-socket", "3-MiB"])
def test_hostile_requests_get_a_typed_error_and_the_mount_still_works(make_device, payload, code, message):
    a = make_device("a")
    (a.mountpoint / "f.txt").write_text("x")
    lines = answer(control_socket(a), payload)
    assert len(lines) == 1, lines
    assert lines[0]["code"] == code and message in lines[0]["error"], lines
    assert lines[0]["protocol"] == CONTROL_PROTOCOL, lines
    assert pid_alive(a.pid), "the daemon died"
    assert os.stat(a.mountpoint / "f.txt").st_blocks > 0, "a refused request evicted f.txt"
    assert (a.mountpoint / "f.txt").read_text() == "x"
    (a.mountpoint / "g.txt").write_text("y")
    res = a.cli("evict", str(a.mountpoint / "nothing-here"), timeout=60)
    assert res.returncode == 1 and "no such item" in res.stderr, res
    res = a.cli("status", str(a.mountpoint), timeout=60)
    assert res.returncode == 0, res


def fake_daemon(path: str, reply: bytes) -> threading.Thread:
    """A socket at `path` that answers one request with `reply`, as a
    daemon of another protocol would."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)

    def serve():
        conn, _ = server.accept()
        with conn:
            conn.settimeout(10)
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            conn.sendall(reply)
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("reply, speaks", [
    (b'{"error":"the request is of protocol 1.0","code":"protocolMismatch","protocol":"2.0"}\n', "protocol 2.0"),
    (b'{"status":{"pid":1,"items":3}}\n', "another protocol"),   # a daemon from before protocol versions
], ids=["newer-major", "unversioned"])
def test_the_cli_names_a_daemon_of_another_protocol(make_device, tmp_path, reply, speaks):
    """The daemon the CLI finds (through the mount record) answers in
    another protocol: the CLI says which, and how to get out, with exit 1."""
    a = make_device("a")
    records = list((a.data_home / "ubiquityfs" / "mounts").glob("*.json"))
    record = next(r for r in records if json.loads(r.read_text())["mountpoint"] == os.path.realpath(a.mountpoint))
    original = record.read_text()
    fake = str(tmp_path / "fake.sock")
    record.write_text(json.dumps({**json.loads(original), "socket": fake}))
    try:
        served = fake_daemon(fake, reply)
        res = a.cli("status", str(a.mountpoint), timeout=60)
        served.join(10)
    finally:
        record.write_text(original)
    assert res.returncode == 1, res
    assert f"this ubiquityfs (protocol {CONTROL_PROTOCOL}) cannot talk to the running daemon ({speaks})" in res.stderr, res
    assert "then mount again with this one" in res.stderr, res
    res = a.cli("status", str(a.mountpoint), timeout=60)
    assert res.returncode == 0, res


def test_failures_exit_1_and_usage_errors_64(tmp_path):
    """Errors reach ArgumentParser as thrown errors: a failure prints its
    message and exits 1; a value the command cannot parse is a usage error."""
    env = {"PATH": "/usr/bin:/bin", "XDG_DATA_HOME": str(tmp_path / "data")}
    res = run("status", str(tmp_path), env=env)
    assert res.returncode == 1 and f"{tmp_path} is not mounted" in res.stderr, res
    res = run("resolve", str(tmp_path / "f"), "--keep", "newest", env=env)
    assert res.returncode == 64 and "--keep" in res.stderr, res
