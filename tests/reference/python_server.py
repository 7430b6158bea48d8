"""A fork server for the test suite's Python reference scripts: torch, transformers and datasets imported once.

Each reference script spends about 4.5 s of a 2-core machine importing transformers before it computes anything;
the suite runs a hundred of them. The server imports them once, then serves each request in a child forked from
that state: the script runs as `python SCRIPT ARGS...` would (sys.argv, __main__, sys.path[0] its folder, the
client's working directory, environment, stdin, stdout and stderr), alone in its own process, so nothing one
script does is seen by the next. The client is tests/reference/run_python.py; without a server, or where the
client's environment differs from the server's in what the imports read, it runs the script itself, the same way,
only slower.

    python_server.py start SOCKET   start the server in the background; returns once it serves (at most 300 s)
    python_server.py stop SOCKET    stop it (waits for nothing: running scripts finish on their own)

The server ends by itself after 20 minutes without a request or 3 hours in all, so an interrupted suite leaves
nothing behind for long. Nothing but the socket's owner can reach it (a Unix socket, mode 0600).
"""
import json
import os
import signal
import socket
import struct
import sys
import time

IDLE_SECONDS = 20 * 60
LIFETIME_SECONDS = 3 * 60 * 60
START_SECONDS = 300


def receive_request(conn):
    """The request (argv, cwd, env) and the client's stdin, stdout and stderr, sent with it (SCM_RIGHTS)."""
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    if len(head) != 8 or len(fds) != 3:
        raise ConnectionError("a request without its length or its three file descriptors")
    size = struct.unpack("!Q", head)[0]
    body = b""
    while len(body) < size:
        chunk = conn.recv(min(1 << 20, size - len(body)))
        if not chunk:
            raise ConnectionError("a request cut short")
        body += chunk
    return json.loads(body), fds


def run_script(argv):
    """Runs argv as the interpreter would (`-c CODE ARGS...` or `SCRIPT ARGS...`); returns its exit status."""
    import runpy
    import traceback

    try:
        if argv[0] == "-c":
            sys.argv = ["-c"] + argv[2:]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


# Variables read when torch, transformers or the Hub's client are imported (caches, offline mode, threads, preloaded
# libraries): a request whose values differ from the server's is declined, and the client runs the script itself.
IMPORT_TIME_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "PYTORCH_", "OMP_", "MKL_",
                        "KMP_", "CUDA_", "NCCL_", "PYTHON", "LD_", "XDG_CACHE_HOME")
DECLINED = -32768
SERVER_ENVIRONMENT = {}  # what the imports read, before they ran (torch sets some variables itself)


# Offline, without progress bars: how the server imports, whatever the request says (the suite never downloads).
ALWAYS = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def import_time_environment(env):
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) and k not in ALWAYS}


def serve_child(conn):
    """In the forked child: become the client's script, run it, send back its exit status."""
    request, fds = receive_request(conn)
    if import_time_environment(request["env"]) != SERVER_ENVIRONMENT:
        conn.sendall(struct.pack("!i", DECLINED))
        os._exit(0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(ALWAYS)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.stdin = open(0, "r", closefd=False)
    status = run_script(request["argv"])
    import atexit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    conn.sendall(struct.pack("!i", status))
    os._exit(status & 0xFF)


def serve(path, listener):
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    started = last = time.monotonic()
    listener.settimeout(30)
    while time.monotonic() - last < IDLE_SECONDS and time.monotonic() - started < LIFETIME_SECONDS:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        last = time.monotonic()
        conn.settimeout(10)  # a client sends its request at once
        try:
            kind = conn.recv(1, socket.MSG_PEEK)
        except OSError:
            conn.close()
            continue
        conn.settimeout(None)
        if kind == b"Q":  # stop
            conn.close()
            break
        if os.fork() == 0:
            listener.close()
            try:
                serve_child(conn)
            finally:
                os._exit(1)
        conn.close()
    listener.close()
    if os.path.exists(path):
        os.unlink(path)


def start(path):
    if os.path.exists(path):
        stop(path)
    ready_r, ready_w = os.pipe()
    if os.fork() > 0:
        os.close(ready_w)
        import select
        if not select.select([ready_r], [], [], START_SECONDS)[0]:
            sys.exit(f"the Python server did not start within {START_SECONDS} s")
        with os.fdopen(ready_r) as ready:
            line = ready.readline()  # "serving\n" once listening, or the error, or "" if it died
        if line.strip() != "serving":
            sys.exit(f"the Python server did not start: {line.strip() or 'it ended'}")
        print(f"serving on {path}")
        return
    os.close(ready_r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        SERVER_ENVIRONMENT.update(import_time_environment(os.environ))
        os.environ.update(ALWAYS)
        import torch  # noqa: F401
        import datasets  # noqa: F401
        import transformers  # noqa: F401
        import transformers.models.bert.modeling_bert  # noqa: F401  (the model classes import most of it)
        import peft  # noqa: F401
        import safetensors.torch  # noqa: F401
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        listener.bind(path)
        os.umask(old)
        listener.listen(64)
    except BaseException as e:
        os.write(ready_w, f"{type(e).__name__}: {e}\n".encode())
        os._exit(1)
    os.write(ready_w, b"serving\n")
    os.close(ready_w)
    serve(path, listener)
    os._exit(0)


def stop(path):
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            s.sendall(b"Q")
    except OSError:
        pass
    if os.path.exists(path):
        os.unlink(path)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: python_server.py start|stop SOCKET")
    (start if sys.argv[1] == "start" else stop)(sys.argv[2])
