"""Threads, signals and processes: the GIL is released while waiting, a forked child gets
an error instead of a hang, the console script works."""

import os
import signal
import sys
import threading
import time

import pytest
import shardify
from conftest import run_cli


def test_another_thread_runs_while_next_waits(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=2, workers=1, prefetch=1)
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        # Each wait gives the GIL up; taking it back needs the main thread to give it up.
        while not stop.wait(0.0005):
            ticks += 1

    old = sys.getswitchinterval()
    # With a 30 s switch interval the counter thread only gets the GIL back when the main
    # thread gives it up on its own: inside next(), while it waits for the workers.
    sys.setswitchinterval(30)
    try:
        thread = threading.Thread(target=count)
        thread.start()
        started = time.perf_counter()
        batches = sum(1 for _ in loader)
        elapsed = time.perf_counter() - started
        stop.set()
    finally:
        sys.setswitchinterval(old)
    thread.join()
    assert batches == 150
    assert elapsed < 20, "the loop never waited for the GIL's switch interval"
    assert ticks > 0, "the other thread never ran while next() waited"


def test_a_signal_handler_runs_while_iterating(train_dir, torch):
    # Ctrl-C is SIGINT; any Python signal handler runs inside next()'s wait the same way.
    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted

    loader = shardify.Loader(train_dir, batch_events=1, workers=1, prefetch=1)
    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
        with pytest.raises(Interrupted):
            while True:
                for _ in loader:
                    pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    # The loader is still usable after the interruption.
    assert sum(1 for _ in shardify.Loader(train_dir, batch_events=100)) == 3


def test_a_forked_child_gets_an_error_not_a_hang(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=16)
    it = iter(loader)
    next(it)  # the worker threads run in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: must raise, and exit without touching the parent's threads
        code = 3
        try:
            next(it)
            code = 1
        except RuntimeError as e:
            code = 0 if "fork" in str(e) and "DataLoader" in str(e) else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(code)
    os.close(write)
    deadline = time.time() + 30
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.read(read, 1) == b"\x00", "the child did not get the fork error"
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's loader goes on.
    assert len(list(it)) == len(loader) - 1


def test_the_console_script_is_the_command_line(train_dir):
    assert run_cli("--version").startswith("shardify ")
    report = run_cli("inspect", str(train_dir))
    assert "300" in report
    run_cli("verify", str(train_dir))
