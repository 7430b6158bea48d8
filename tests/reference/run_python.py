"""Runs a Python reference script through tests/reference/python_server.py when one serves, else here.

    run_python.py SCRIPT ARGS...      as `python SCRIPT ARGS...`
    run_python.py -c CODE ARGS...     as `python -c CODE ARGS...`

The server's socket is SHARDTRAIN_PYTHON_SERVER's path. Either way the script sees the same argv, working
directory, environment, stdin, stdout and stderr, and this process exits with its status.
"""
import json
import os
import socket
import struct
import sys

from python_server import DECLINED, run_script


def through_server(path, argv):
    """The script's exit status from the server, or None when none serves at `path`."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    with s:
        body = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        sys.stdout.flush()
        sys.stderr.flush()
        socket.send_fds(s, [struct.pack("!Q", len(body))], [0, 1, 2])
        s.sendall(body)
        status = b""
        while len(status) < 4:
            chunk = s.recv(4 - len(status))
            if not chunk:  # the child died without a word (a signal): as the interpreter would have
                return 1
            status += chunk
        status = struct.unpack("!i", status)[0]
        return None if status == DECLINED else status


def main():
    argv = sys.argv[1:]
    if not argv:
        sys.exit("usage: run_python.py SCRIPT ARGS... | -c CODE ARGS...")
    path = os.environ.get("SHARDTRAIN_PYTHON_SERVER", "")
    status = through_server(path, argv) if path else None
    if status is None:
        status = run_script(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status & 0xFF)


if __name__ == "__main__":
    main()
