"""The Rust side's warnings reach Python's ``logging`` (logger ``shardify.<module>``) at the
next call that holds the GIL, and the console script's stderr at once."""

import logging
import os
import subprocess
import threading
import time

import shardify
from conftest import locked_as_a_copy_would, shardify_command

WAITING = "another `shardify copy` is writing into it; waiting for it to end"


def test_a_copy_waiting_for_another_logs_a_warning(train_dir, tmp_path, caplog):
    copy = tmp_path / "copy"
    reports = []
    with caplog.at_level(logging.WARNING, logger="shardify"):
        with locked_as_a_copy_would(copy):
            waiting = threading.Thread(
                target=lambda: reports.append(shardify.copy_dataset(train_dir, copy)))
            waiting.start()
            time.sleep(0.3)
            assert waiting.is_alive() and not (copy / "manifest.json").exists()
        waiting.join(timeout=60)
    assert reports and reports[0]["outcome"] == "copied"
    records = [r for r in caplog.records if WAITING in r.getMessage()]
    assert len(records) == 1, caplog.records
    assert records[0].name == "shardify.dataset.copy.destination"
    assert records[0].levelno == logging.WARNING
    assert records[0].getMessage() == f"{copy}: {WAITING}"
    # Handed over once: the next call logs nothing again.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardify"):
        assert shardify.copy_dataset(train_dir, copy)["outcome"] == "present"
    assert not caplog.records


def test_the_console_script_prints_the_warning_while_it_waits(train_dir, tmp_path):
    copy = tmp_path / "copy"
    with locked_as_a_copy_would(copy):
        waiting = subprocess.Popen([shardify_command(), "copy", str(train_dir), str(copy)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = ""
        while WAITING not in line:
            line = waiting.stderr.readline()
            assert line, f"the copy ended without waiting: {waiting.wait()}"
        assert line.startswith(" WARN ") and str(copy) in line, line
        assert not (copy / "manifest.json").exists()
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 0 and "checksums match" in out


def test_the_console_script_takes_rust_log_as_the_binary_does(train_dir, tmp_path):
    """RUST_LOG=error silences the warnings, as it does for the compiled binary (the console
    script printed WARN and above whatever it said)."""
    copy = tmp_path / "copy"
    environment = {**os.environ, "RUST_LOG": "error"}
    with locked_as_a_copy_would(copy):
        waiting = subprocess.Popen([shardify_command(), "copy", str(train_dir), str(copy)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=environment)
        time.sleep(1.0)
        assert waiting.poll() is None, "it waits for the lock"
        assert not (copy / "manifest.json").exists()
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0 and "checksums match" in out, err
    assert WAITING not in err and "WARN" not in err, err
